package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/peer/peertest"
)

// testCA signs peer certificates, as a cluster CA does.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// auth is a node's Auth: a certificate ca signed, trusting the CA trust
// (ca itself when nil), and the token tok when not "".
func (ca *testCA) auth(t *testing.T, trust *testCA, tok string) *Auth {
	t.Helper()
	if trust == nil {
		trust = ca
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := &Auth{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), CAFile: filepath.Join(dir, "ca.crt")}
	for f, b := range map[string][]byte{
		a.CertFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		a.KeyFile:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		a.CAFile:   trust.pem,
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if tok != "" {
		a.TokenFile = filepath.Join(dir, "token")
		if err := os.WriteFile(a.TokenFile, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Load(); err != nil {
		t.Fatal(err)
	}
	return a
}

// ask GETs path of the peer at addr as a holds it, with a's token when it
// has one: the status, or the error that stopped the request.
func ask(a *Auth, addr, path string) (int, error) {
	cfg := a.TLSConfig()
	if cfg == nil {
		cfg = &tls.Config{InsecureSkipVerify: true} // a client with no certificate of its own
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// A client certificate is a peer's only if the cluster CA signed it: one
// from another CA is refused in the handshake.
func TestClientCertificateFromAnotherCAIsRefused(t *testing.T) {
	c := synth(t)
	ca, other := newCA(t, "cluster"), newCA(t, "other")
	s, _ := seeded(t, c, 64<<10)
	addr := serve(t, ca.auth(t, nil, ""), slog.New(slog.DiscardHandler), s)
	path := "/v1/checkpoints/" + c.Hash() + "/manifest"
	if code, err := ask(ca.auth(t, nil, ""), addr, path); code != http.StatusOK {
		t.Fatalf("a peer with the cluster CA's certificate: %d, %v", code, err)
	}
	// It trusts the cluster CA, so that it is the server that decides.
	if code, err := ask(other.auth(t, ca, ""), addr, path); err == nil {
		t.Fatalf("a certificate from another CA was served: %d", code)
	}
	if code, err := ask(&Auth{}, addr, path); err == nil {
		t.Fatalf("a client without a certificate was served: %d", code)
	}
}

// With the CA and a token both, a peer needs both: the certificate for
// the handshake, the token inside it; a request without the token is
// answered 401 and its connection closed.
func TestCertificatesAndTokenAreBothRequired(t *testing.T) {
	c := synth(t)
	ca := newCA(t, "cluster")
	s, _ := seeded(t, c, 64<<10)
	addr := serve(t, ca.auth(t, nil, "right"), slog.New(slog.DiscardHandler), s)
	path := "/v1/checkpoints/" + c.Hash() + "/manifest"
	if code, err := ask(ca.auth(t, nil, "right"), addr, path); code != http.StatusOK {
		t.Fatalf("certificate and token: %d, %v", code, err)
	}
	if code, err := ask(ca.auth(t, nil, "wrong"), addr, path); code != http.StatusUnauthorized {
		t.Fatalf("certificate and a wrong token: %d, %v; want 401", code, err)
	}
	if code, err := ask(token(t, "right"), addr, path); err == nil {
		t.Fatalf("the token without a certificate of the CA: %d; want a refused handshake", code)
	}
	// HTTP/1.1, the 401 on a connection the server then closes.
	cfg := ca.auth(t, nil, "").TLSConfig()
	cfg.NextProtos = []string{"http/1.1"}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: peer\r\n\r\nGET "+path+" HTTP/1.1\r\nHost: peer\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the connection was not closed after the 401: %v (%q)", err, b)
	}
	if n := strings.Count(string(b), "HTTP/1.1 401"); n != 1 {
		t.Fatalf("%d answers 401 on one connection, want 1 and then the end of it:\n%s", n, b)
	}
	// HTTP/2, where the connection is closed once the 401 has gone.
	f, err := peertest.Dial(ca.auth(t, nil, "").TLSConfig(), "127.0.0.1", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Get(1, path, "wrong")
	select {
	case <-f.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("an HTTP/2 connection refused 401 still open after 10 s")
	}
	if f.Answered() != 1 {
		t.Fatalf("%d answers before the HTTP/2 connection closed, want the 401", f.Answered())
	}
}

// In token mode both ends prove they hold the token by a key derived
// from it: a node without it neither gets an answer nor gives one.
func TestTokenModeAuthenticatesBothEnds(t *testing.T) {
	c := synth(t)
	s, digest := seeded(t, c, 64<<10)
	var logs logBuf
	addr := serve(t, token(t, "right"), slog.New(slog.NewTextHandler(&logs, nil)), s)
	path := "/v1/checkpoints/" + c.Hash() + "/manifest"

	cfg := token(t, "right").TLSConfig()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer right")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 || resp.TLS == nil {
		t.Fatalf("a peer with the token: %s over %s, TLS %v; want 200 over HTTP/2 in TLS", resp.Status, resp.Proto, resp.TLS != nil)
	}
	// Plain HTTP, even with the token, and TLS with another token's key:
	// the handshake fails, no HTTP answer comes.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: peer\r\nAuthorization: Bearer right\r\n\r\n")
	b, _ := io.ReadAll(conn)
	conn.Close()
	if strings.Contains(string(b), "HTTP/") {
		t.Fatalf("plain HTTP was answered: %q", b)
	}
	if code, err := ask(token(t, "wrong"), addr, path); err == nil {
		t.Fatalf("a client with another token was answered %d", code)
	}
	sd := &Seeder{Auth: token(t, "wrong"), Peers: []string{addr}, Digest: digest, Timeout: 300 * time.Millisecond, Log: slog.New(slog.DiscardHandler)}
	s2, _ := NewStore(c, 64<<10, nil)
	defer s2.Close()
	if err := sd.Fill(context.Background(), s2); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("a seeder with another token: %v, want ErrNoManifest", err)
	}
	if !strings.Contains(logs.String(), "level=WARN msg=\"peer refused: no valid token") {
		t.Fatalf("the refusal is not logged as a warning:\n%s", logs.String())
	}
}

// squatter answers at a peer's address without the token: it serves a
// forged checkpoint and records what it is sent.
type squatter struct {
	mu    sync.Mutex
	asked int
	auth  []string // Authorization headers it was sent
}

func (sq *squatter) handler(forged *Store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := forged.manifest()
		_, _ = w.Write(raw)
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(forged.haveMap())
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.PathValue("file"))
		j, _ := strconv.Atoi(r.PathValue("piece"))
		_, _ = forged.send(i, j, w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sq.mu.Lock()
		sq.asked++
		if a := r.Header.Get("Authorization"); a != "" {
			sq.auth = append(sq.auth, a)
		}
		sq.mu.Unlock()
		mux.ServeHTTP(w, r)
	})
}

// forgedCheckpoint is c with one weight byte changed: the same names,
// sizes and headers (the same checkpoint hash), other bytes.
func forgedCheckpoint(t *testing.T, pieceSize int64) (good, forged *Store) {
	t.Helper()
	c := synth(t)
	good, _ = seeded(t, c, pieceSize)
	dir := t.TempDir()
	src := filepath.Dir(c.Shards[0].Path)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == c.Shards[0].Name {
			b[len(b)-1] ^= 0xff // the last byte is a tensor's, not the header's
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fc, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if fc.Hash() != c.Hash() {
		t.Fatalf("the forged checkpoint's hash %s is not the original's %s", fc.Hash(), c.Hash())
	}
	forged, _ = seeded(t, fc, pieceSize)
	return good, forged
}

// A node that answers at a peer's address without the token (a reused pod
// IP, a squatted port) is sent neither the token nor a request, and with
// --peer-trust-peers its forged manifest is not taken: the seeder reads
// storage.
func TestSquatterGetsNoTokenAndServesNothing(t *testing.T) {
	good, forged := forgedCheckpoint(t, 64<<10)
	other := token(t, "not the cluster's")
	for _, tc := range []struct {
		name  string
		serve func(l net.Listener, h http.Handler) error
	}{
		{"plain HTTP", func(l net.Listener, h http.Handler) error { return http.Serve(l, h) }},
		{"TLS with a key of its own", func(l net.Listener, h http.Handler) error {
			cfg := other.TLSConfig()
			cfg.ClientAuth, cfg.VerifyConnection = tls.RequestClientCert, nil // it takes anyone
			return http.Serve(tls.NewListener(l, cfg), h)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			sq := &squatter{}
			go func() { _ = tc.serve(l, sq.handler(forged)) }()
			s, err := NewStore(good.ckpt, 64<<10, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			sd := &Seeder{Auth: token(t, "cluster-secret"), Peers: []string{l.Addr().String()}, Trust: true,
				Timeout: 300 * time.Millisecond, Log: slog.New(slog.DiscardHandler)}
			err = sd.Fill(context.Background(), s)
			sq.mu.Lock()
			defer sq.mu.Unlock()
			if len(sq.auth) > 0 {
				t.Errorf("the squatter was sent the token: %q", sq.auth[0])
			}
			if sq.asked > 0 {
				t.Errorf("the squatter was asked %d requests", sq.asked)
			}
			if !errors.Is(err, ErrNoManifest) || s.Digest() != "" {
				t.Fatalf("seed from the squatter: %v, manifest %q taken; want ErrNoManifest and none", err, s.Digest())
			}
		})
	}
}
