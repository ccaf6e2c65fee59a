// Package authtest serves a JWK Set over HTTP for tests: it holds signing
// keys by kid, publishes the public halves at /jwks.json, signs tokens
// with any of them, and can rotate keys in and out while a Verifier is
// running against it.
package authtest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

// Key is a signing key of the set.
type Key struct {
	KID    string
	Alg    string // RS256, ES256 or EdDSA
	Method jwt.SigningMethod
	Signer any // the private key
	Public any // the public key
}

// NewKey generates a key for alg (RS256, ES256 or EdDSA).
func NewKey(kid, alg string) (*Key, error) {
	k := &Key{KID: kid, Alg: alg}
	switch alg {
	case "RS256":
		priv, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, fmt.Errorf("authtest: generate RSA key: %w", err)
		}
		k.Method, k.Signer, k.Public = jwt.SigningMethodRS256, priv, &priv.PublicKey
	case "ES256":
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("authtest: generate ECDSA key: %w", err)
		}
		k.Method, k.Signer, k.Public = jwt.SigningMethodES256, priv, &priv.PublicKey
	case "EdDSA":
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("authtest: generate Ed25519 key: %w", err)
		}
		k.Method, k.Signer, k.Public = jwt.SigningMethodEdDSA, priv, pub
	default:
		return nil, fmt.Errorf("authtest: unsupported alg %q", alg)
	}
	return k, nil
}

// Claims of a token to sign; zero fields are left out (Exp: one hour).
type Claims struct {
	Subject  string
	Issuer   string
	Audience string
	TTL      time.Duration
}

// Sign returns a token signed by k, with its kid in the header.
func (k *Key) Sign(c Claims) (string, error) {
	now := time.Now()
	if c.TTL == 0 {
		c.TTL = time.Hour
	}
	rc := jwt.RegisteredClaims{Subject: c.Subject, Issuer: c.Issuer, IssuedAt: jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(c.TTL))}
	if c.Audience != "" {
		rc.Audience = jwt.ClaimStrings{c.Audience}
	}
	t := jwt.NewWithClaims(k.Method, rc)
	t.Header["kid"] = k.KID
	s, err := t.SignedString(k.Signer)
	if err != nil {
		return "", fmt.Errorf("authtest: sign with %s: %w", k.KID, err)
	}
	return s, nil
}

// Server publishes the public keys of a set at URL.
type Server struct {
	srv     *httptest.Server
	mu      sync.Mutex
	keys    []*Key
	fetches atomic.Int64
}

// NewServer starts a JWKS server publishing keys. Close it when done.
func NewServer(keys ...*Key) *Server {
	s := &Server{keys: keys}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the JWK Set's address.
func (s *Server) URL() string { return s.srv.URL + "/jwks.json" }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Fetches is how many times the set was served.
func (s *Server) Fetches() int64 { return s.fetches.Load() }

// SetKeys replaces the published keys (a rotation: keys left out are
// rotated out).
func (s *Server) SetKeys(keys ...*Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = keys
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/jwks.json" {
		http.NotFound(w, r)
		return
	}
	s.fetches.Add(1)
	s.mu.Lock()
	keys := append([]*Key(nil), s.keys...)
	s.mu.Unlock()
	b, err := SetJSON(keys...)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// SetJSON is the JWK Set (public keys only) of keys.
func SetJSON(keys ...*Key) ([]byte, error) {
	set := jwkset.JWKSMarshal{Keys: []jwkset.JWKMarshal{}}
	for _, k := range keys {
		j, err := jwkset.NewJWKFromKey(k.Public, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{
			KID: k.KID, ALG: jwkset.ALG(k.Alg), USE: jwkset.UseSig}})
		if err != nil {
			return nil, fmt.Errorf("authtest: JWK of %s: %w", k.KID, err)
		}
		set.Keys = append(set.Keys, j.Marshal())
	}
	return json.Marshal(set)
}
