package daemon

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/protocol"
)

// Every fingerprint field, changed alone, is a mismatch naming that field:
// found by reflection, so that a field added later is covered too.
func TestMismatchOnEveryFingerprintField(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	base := d.cfg.Fingerprint
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		t.Run(name, func(t *testing.T) {
			fp := base
			v := reflect.ValueOf(&fp).Elem().Field(i)
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "-other")
			case reflect.Int:
				v.SetInt(v.Int() + 1)
			default:
				t.Fatalf("field %s of kind %s: teach this test to change it", name, v.Kind())
			}
			c := rawConn(t, d.Socket())
			fr, err := c.Call(context.Background(), protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}, protocol.TypeMismatch)
			if err != nil {
				t.Fatal(err)
			}
			var m protocol.Mismatch
			if err := fr.Decode(&m); err != nil {
				t.Fatal(err)
			}
			if len(m.Fields) != 1 || m.Fields[0].Field != name {
				t.Fatalf("changed %s, mismatch names %+v", name, m.Fields)
			}
		})
	}
	if got := d.Stats().Mismatches; len(got) != typ.NumField() {
		t.Fatalf("mismatches by field: %v, want one for each of %d fields", got, typ.NumField())
	}
}
