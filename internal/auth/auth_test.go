package auth

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestMintVerify(t *testing.T) {
	secret := []byte("s3cret")
	now := time.Now()
	tok, err := Mint(secret, "u1", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if sub, exp, err := Verify(secret, tok); err != nil || sub != "u1" || !exp.Equal(now.Add(time.Hour).Truncate(time.Second)) {
		t.Fatalf("verify: %q %v %v", sub, exp, err)
	}
	nbf, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "u1",
		ExpiresAt: jwt.NewNumericDate(now.Add(2 * time.Hour)), NotBefore: jwt.NewNumericDate(now.Add(time.Hour))}).SignedString(secret)
	if _, _, err := Verify(secret, nbf); err == nil {
		t.Fatal("token before its nbf accepted")
	}
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "u1"}).SignedString(secret)
	if _, _, err := Verify(secret, noExp); err == nil {
		t.Fatal("token without exp accepted")
	}
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.RegisteredClaims{Subject: "u1", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if _, _, err := Verify(secret, none); err == nil {
		t.Fatal("alg=none token accepted")
	}
	if _, _, err := Verify([]byte("other"), tok); err == nil {
		t.Fatal("wrong secret accepted")
	}
	old, _ := Mint(secret, "u1", time.Minute, now.Add(-time.Hour))
	if _, _, err := Verify(secret, old); err == nil {
		t.Fatal("expired token accepted")
	}
	if _, _, err := Verify(secret, "garbage"); err == nil {
		t.Fatal("garbage accepted")
	}
	if _, err := Mint(secret, "bad user", time.Hour, now); err == nil {
		t.Fatal("bad user id minted")
	}
}

func TestLoadSecretGeneratesOnce(t *testing.T) {
	t.Setenv("CHATPIPE_JWT_SECRET", "")
	dir := t.TempDir()
	a, err := LoadSecret("", dir, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadSecret("", dir, false)
	if err != nil || string(a) != string(b) || len(a) < 32 {
		t.Fatalf("secret not stable: %q %q %v", a, b, err)
	}
	if s, _ := LoadSecret("x", dir, true); string(s) != "x" {
		t.Fatal("explicit secret ignored")
	}
}
