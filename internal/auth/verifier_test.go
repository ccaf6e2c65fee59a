package auth_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/auth/authtest"
)

func newKey(t *testing.T, kid, alg string) *authtest.Key {
	t.Helper()
	k, err := authtest.NewKey(kid, alg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sign(t *testing.T, k *authtest.Key, c authtest.Claims) string {
	t.Helper()
	tok, err := k.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func newVerifier(t *testing.T, o auth.Options) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

func mustVerify(t *testing.T, v *auth.Verifier, tok, user string) {
	t.Helper()
	c, err := v.Verify(context.Background(), tok)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if c.Subject != user || time.Until(c.ExpiresAt) <= 0 {
		t.Fatalf("claims %+v, want sub %s and a future exp", c, user)
	}
}

func mustRefuse(t *testing.T, v *auth.Verifier, tok, why string) {
	t.Helper()
	_, err := v.Verify(context.Background(), tok)
	if err == nil {
		t.Fatalf("%s: accepted", why)
	}
	if !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("%s: %v does not wrap ErrInvalidToken", why, err)
	}
}

// Tokens signed by each asymmetric algorithm verify against the JWK Set;
// the shared secret keeps working beside it.
func TestJWKSAlgorithms(t *testing.T) {
	rs, es, ed := newKey(t, "rs-1", "RS256"), newKey(t, "es-1", "ES256"), newKey(t, "ed-1", "EdDSA")
	srv := authtest.NewServer(rs, es, ed)
	defer srv.Close()
	secret := []byte(strings.Repeat("s", 32))
	v := newVerifier(t, auth.Options{Secret: secret, JWKSURL: srv.URL()})
	for _, k := range []*authtest.Key{rs, es, ed} {
		mustVerify(t, v, sign(t, k, authtest.Claims{Subject: "u-" + k.Alg}), "u-"+k.Alg)
	}
	hs, err := auth.Mint(secret, "u1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, v, hs, "u1")

	// A token signed by a key outside the set, under a kid of the set.
	other := newKey(t, "rs-1", "RS256")
	mustRefuse(t, v, sign(t, other, authtest.Claims{Subject: "u1"}), "signed by a key outside the set")
	// Expired beyond the leeway.
	mustRefuse(t, v, sign(t, rs, authtest.Claims{Subject: "u1", TTL: -time.Minute}), "expired token")
	// No sub.
	mustRefuse(t, v, sign(t, rs, authtest.Claims{}), "token without sub")

	// JWKS only: HS256 is off.
	jv := newVerifier(t, auth.Options{JWKSURL: srv.URL()})
	mustRefuse(t, jv, hs, "HS256 token without a secret")
	mustVerify(t, jv, sign(t, es, authtest.Claims{Subject: "u2"}), "u2")
}

// A key rotated out of the set is refused and one rotated in works, without
// a new Verifier: an unknown kid fetches the set again (rate-limited), and
// so does the periodic refresh.
func TestJWKSRotation(t *testing.T) {
	old, next := newKey(t, "k-old", "RS256"), newKey(t, "k-new", "ES256")
	srv := authtest.NewServer(old)
	defer srv.Close()
	v := newVerifier(t, auth.Options{JWKSURL: srv.URL(), JWKSRefresh: time.Hour, JWKSMinRefresh: time.Hour})
	oldTok := sign(t, old, authtest.Claims{Subject: "u1"})
	newTok := sign(t, next, authtest.Claims{Subject: "u1"})
	mustVerify(t, v, oldTok, "u1")

	srv.SetKeys(next)
	before := srv.Fetches()
	mustVerify(t, v, newTok, "u1") // unknown kid: fetched again
	if srv.Fetches() != before+1 {
		t.Fatalf("fetches %d → %d, want one more", before, srv.Fetches())
	}
	mustRefuse(t, v, oldTok, "token of a rotated-out key")

	// The unknown-kid fetch is rate-limited: another unknown kid within
	// JWKSMinRefresh is refused without asking the server.
	stranger := newKey(t, "k-stranger", "RS256")
	before = srv.Fetches()
	mustRefuse(t, v, sign(t, stranger, authtest.Claims{Subject: "u1"}), "unknown kid")
	if srv.Fetches() != before {
		t.Fatalf("an unknown kid fetched the set again within the rate limit")
	}

	// The periodic refresh drops a rotated-out key by itself.
	pv := newVerifier(t, auth.Options{JWKSURL: srv.URL(), JWKSRefresh: 50 * time.Millisecond, JWKSMinRefresh: time.Hour})
	mustVerify(t, pv, newTok, "u1")
	third := newKey(t, "k-third", "EdDSA")
	srv.SetKeys(third)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := pv.Verify(context.Background(), newTok); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a rotated-out key still works 5 s after the set dropped it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustVerify(t, pv, sign(t, third, authtest.Claims{Subject: "u3"}), "u3")
}

func TestIssuerAudience(t *testing.T) {
	k := newKey(t, "k1", "RS256")
	srv := authtest.NewServer(k)
	defer srv.Close()
	secret := []byte(strings.Repeat("s", 32))
	v := newVerifier(t, auth.Options{Secret: secret, JWKSURL: srv.URL(), Issuer: "https://id.example", Audience: "chatpipe"})
	mustVerify(t, v, sign(t, k, authtest.Claims{Subject: "u1", Issuer: "https://id.example", Audience: "chatpipe"}), "u1")
	mustRefuse(t, v, sign(t, k, authtest.Claims{Subject: "u1", Issuer: "https://evil.example", Audience: "chatpipe"}), "wrong iss")
	mustRefuse(t, v, sign(t, k, authtest.Claims{Subject: "u1", Issuer: "https://id.example", Audience: "other-app"}), "wrong aud")
	mustRefuse(t, v, sign(t, k, authtest.Claims{Subject: "u1", Audience: "chatpipe"}), "no iss")
	mustRefuse(t, v, sign(t, k, authtest.Claims{Subject: "u1", Issuer: "https://id.example"}), "no aud")
	mustRefuse(t, v, sign(t, k, authtest.Claims{Subject: "u1", Issuer: "https://id.example/", Audience: "chatpipe"}), "iss not an exact match")
	// HS256 tokens are held to the same checks.
	hs, _ := auth.Mint(secret, "u1", time.Hour, time.Now())
	mustRefuse(t, v, hs, "HS256 token without iss and aud")
	hs, _ = auth.MintFor(secret, "u1", time.Hour, time.Now(), "https://id.example", "chatpipe")
	mustVerify(t, v, hs, "u1")
}

// Algorithm confusion: an HS256 token whose HMAC key is the RSA public
// key (as PEM or DER), and an alg=none token, are refused, with and
// without a shared secret.
func TestAlgConfusion(t *testing.T) {
	k := newKey(t, "k1", "RS256")
	srv := authtest.NewServer(k)
	defer srv.Close()
	der, err := x509.MarshalPKIXPublicKey(k.Public)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	claims := jwt.RegisteredClaims{Subject: "u1", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}
	var bad []string
	for _, hmacKey := range [][]byte{pemKey, der} {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(hmacKey)
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, s)
	}
	none := jwt.NewWithClaims(jwt.SigningMethodNone, claims)
	none.Header["kid"] = "k1"
	s, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	bad = append(bad, s)
	// RS256 header on an HMAC signature.
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	hs.Header["kid"] = "k1"
	hsStr, _ := hs.SignedString(pemKey)
	parts := strings.Split(hsStr, ".")
	rsHeader := strings.Split(sign(t, k, authtest.Claims{Subject: "u1"}), ".")[0]
	bad = append(bad, rsHeader+"."+parts[1]+"."+parts[2])

	for _, o := range []auth.Options{{JWKSURL: srv.URL()}, {JWKSURL: srv.URL(), Secret: []byte(strings.Repeat("s", 32))}} {
		v := newVerifier(t, o)
		for i, tok := range bad {
			mustRefuse(t, v, tok, "confused token "+string(rune('0'+i)))
		}
		mustVerify(t, v, sign(t, k, authtest.Claims{Subject: "u1"}), "u1")
	}
}

func TestVerifierConfig(t *testing.T) {
	if _, err := auth.NewVerifier(context.Background(), auth.Options{}); err == nil {
		t.Fatal("a verifier with no key accepted")
	}
	if _, err := auth.NewVerifier(context.Background(), auth.Options{JWKSURL: "file:///etc/passwd"}); err == nil {
		t.Fatal("a file JWKS URL accepted")
	}
	srv := authtest.NewServer()
	url := srv.URL()
	srv.Close()
	if _, err := auth.NewVerifier(context.Background(), auth.Options{JWKSURL: url}); err == nil {
		t.Fatal("an unreachable JWKS URL accepted at start")
	}
	v := newVerifier(t, auth.Options{Secret: []byte("x"), Leeway: -1})
	if v.Leeway() != 0 {
		t.Fatalf("negative leeway: %v", v.Leeway())
	}
	if newVerifier(t, auth.Options{Secret: []byte("x")}).Leeway() != auth.DefaultLeeway {
		t.Fatal("default leeway")
	}
}

// Close stops the refresher: the set is not fetched any more.
func TestVerifierCloseStopsRefresh(t *testing.T) {
	srv := authtest.NewServer(newKey(t, "k1", "EdDSA"))
	defer srv.Close()
	v, err := auth.NewVerifier(context.Background(), auth.Options{JWKSURL: srv.URL(), JWKSRefresh: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if srv.Fetches() < 2 {
		t.Fatalf("fetches %d: no periodic refresh", srv.Fetches())
	}
	v.Close()
	time.Sleep(50 * time.Millisecond)
	n := srv.Fetches()
	time.Sleep(150 * time.Millisecond)
	if srv.Fetches() != n {
		t.Fatalf("fetched %d more times after Close", srv.Fetches()-n)
	}
}
