package peer

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"time"
)

// Auth is how peers prove they belong to the cluster: mutual TLS with a
// cluster CA, a shared token, or both. A node serves and asks with the
// same one, and both ends of every connection prove themselves before a
// request is sent: with a token alone, by a TLS key derived from it.
type Auth struct {
	CertFile, KeyFile, CAFile string
	TokenFile                 string
	tls                       *tls.Config // never used itself: TLSConfig is
	token                     string
}

// tokenKeyInfo labels the key derived from the token: the same token
// gives the same key on every node, and no other use of it shares it.
const tokenKeyInfo = "weightcache peer TLS key v1"

// errNotToken is a peer whose TLS key is not the one the token derives.
var errNotToken = errors.New("it does not hold this node's peer token (its TLS key is not the one derived from --peer-token-file)")

// Load reads the files; it refuses an Auth that authenticates nobody.
func (a *Auth) Load() error {
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return fmt.Errorf("--peer-token-file: %w", err)
		}
		if a.token = strings.TrimSpace(string(b)); a.token == "" {
			return fmt.Errorf("--peer-token-file %s: empty", a.TokenFile)
		}
	}
	var err error
	switch {
	case a.CertFile != "" || a.KeyFile != "" || a.CAFile != "":
		// The token, if any, then travels as a bearer token inside the
		// channel the CA authenticated: both are required.
		a.tls, err = a.caTLS()
	case a.token != "":
		a.tls, err = tokenTLS(a.token)
	default:
		return errors.New("peers must authenticate: give --peer-tls-cert, --peer-tls-key and --peer-tls-ca, or --peer-token-file")
	}
	return err
}

// AuthenticatesServer says whether the flags name a way for the peers
// this node asks to prove themselves: every mode Load accepts does.
func (a *Auth) AuthenticatesServer() bool {
	return a.TokenFile != "" || a.CertFile != "" && a.KeyFile != "" && a.CAFile != ""
}

// TLSConfig is the TLS both ends of a peer connection use once Load has
// succeeded, nil before: a copy for each use, since http.Server and
// http.Transport write to the one they are given.
func (a *Auth) TLSConfig() *tls.Config {
	if a.tls == nil {
		return nil
	}
	return a.tls.Clone()
}

func (a *Auth) scheme() string {
	if a.tls != nil {
		return "https"
	}
	return "http"
}

func (a *Auth) caTLS() (*tls.Config, error) {
	if a.CertFile == "" || a.KeyFile == "" || a.CAFile == "" {
		return nil, errors.New("peer TLS needs all of --peer-tls-cert, --peer-tls-key and --peer-tls-ca")
	}
	cert, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--peer-tls-cert %s, --peer-tls-key %s: %w", a.CertFile, a.KeyFile, err)
	}
	pem, err := os.ReadFile(a.CAFile)
	if err != nil {
		return nil, fmt.Errorf("--peer-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--peer-tls-ca %s: no PEM certificate in it", a.CAFile)
	}
	// Any certificate the cluster CA signed is a peer: pods come and go
	// by IP, so names are not checked, the chain is.
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	return peerTLS(cert, verify), nil
}

// tokenTLS authenticates both ends by the token without sending it: each
// presents a certificate for the key the token derives and accepts only
// that key from the other, so an end without the token fails the
// handshake before a request is written or answered.
func tokenTLS(token string) (*tls.Config, error) {
	seed, err := hkdf.Key(sha256.New, []byte(token), nil, tokenKeyInfo, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("--peer-token-file: deriving its key: %w", err)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	// Only the key is checked, never the certificate's dates or names:
	// any fixed ones do.
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weightcache peer"},
		NotBefore: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("--peer-token-file: its certificate: %w", err)
	}
	verify := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		if k, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey); !ok || !k.Equal(pub) {
			return errNotToken
		}
		return nil
	}
	return peerTLS(tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, verify), nil
}

// peerTLS is the one configuration both ends use: TLS 1.3, a certificate
// each way, and verify deciding who is a peer.
func peerTLS(cert tls.Certificate, verify func(tls.ConnectionState) error) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert, InsecureSkipVerify: true, VerifyConnection: verify,
		NextProtos: []string{"h2", "http/1.1"}}
}
