package commands

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// byteUnits are the suffixes a byte flag takes, matched without regard to
// case. k, M, G and T are powers of 1000 as in SI (and as kubectl and
// Docker read them); KiB to TiB are powers of 1024. Both are accepted
// because operators copy sizes from either world, and saying which is
// which in the help beats guessing.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"ki", 1 << 10}, {"mi", 1 << 20}, {"gi", 1 << 30}, {"ti", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12},
	{"b", 1},
}

var errByteSize = errors.New("want a byte count: an integer, or a number with a unit (512MiB, 1GiB, 1.5G; k, M, G, T are powers of 1000, KiB, MiB, GiB, TiB of 1024)")

// parseBytes reads a byte count: a plain integer or a number with a unit
// from byteUnits. A fraction is taken only where it comes to whole bytes
// (1.5KiB is 1536, 1.5B is refused) so that no size is silently rounded.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return 0, errors.New("a byte count cannot be negative")
		}
		return n, nil
	}
	lower := strings.ToLower(t)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(lower, u.suffix)
		if !ok {
			continue
		}
		num = strings.TrimSpace(num)
		if num == "" || strings.ContainsAny(num, "+-eE_") {
			return 0, errByteSize
		}
		r, ok := new(big.Rat).SetString(num)
		if !ok {
			return 0, errByteSize
		}
		r.Mul(r, new(big.Rat).SetInt64(u.mult))
		if !r.IsInt() {
			return 0, fmt.Errorf("%s is not a whole number of bytes", s)
		}
		if !r.Num().IsInt64() {
			return 0, fmt.Errorf("%s is more than %d bytes", s, int64(math.MaxInt64))
		}
		return r.Num().Int64(), nil
	}
	return 0, errByteSize
}

// formatBytes writes n in the largest binary unit that divides it, so that
// a default reads as it was meant (1GiB, 512MiB) and parses back to n.
func formatBytes(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// byteFlag is a flag.Value for a byte count; the flag package names the
// flag in the error when Set fails.
type byteFlag struct{ p *int64 }

func (b byteFlag) String() string {
	if b.p == nil {
		return "0"
	}
	return formatBytes(*b.p)
}

func (b byteFlag) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// bytesVar defines a byte-count flag; its synopsis in help reads "size"
// (a usage that quotes its own `name` keeps it).
func bytesVar(fs *flag.FlagSet, p *int64, name string, value int64, usage string) {
	*p = value
	if !strings.Contains(usage, "`") {
		usage += " (a `size`, e.g. 512MiB)"
	}
	fs.Var(byteFlag{p}, name, usage)
}
