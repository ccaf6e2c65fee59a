// Package auth mints and verifies the JWTs that authenticate websocket
// clients: HS256 with the deployment's shared secret, and RS256, ES256 and
// EdDSA against a JWK Set fetched from a URL (Verifier). `sub` is the user
// id, `exp` is required and honoured, `nbf` and `iat` are checked when
// present, `iss` and `aud` when the Verifier is told to.
package auth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/chatpipe/chatpipe/protocol"
)

// ErrInvalidToken is returned by Verify for any token that must not be let in.
var ErrInvalidToken = errors.New("auth: invalid token")

// Mint returns an HS256 token for user valid for ttl.
func Mint(secret []byte, user string, ttl time.Duration, now time.Time) (string, error) {
	return MintFor(secret, user, ttl, now, "", "")
}

// MintFor is Mint with an iss and an aud claim (each left out when empty),
// for a gateway started with --jwt-issuer or --jwt-audience.
func MintFor(secret []byte, user string, ttl time.Duration, now time.Time, issuer, audience string) (string, error) {
	if e := protocol.CheckID("user", user, protocol.DefaultLimits()); e != nil {
		return "", fmt.Errorf("auth: %s", e.Message)
	}
	claims := jwt.RegisteredClaims{
		Subject:   user,
		Issuer:    issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}
	if audience != "" {
		claims.Audience = jwt.ClaimStrings{audience}
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
	if err != nil {
		return "", fmt.Errorf("auth: sign: %w", err)
	}
	return s, nil
}

// Verify checks an HS256 token against secret (no iss or aud check, the
// default leeway) and returns its subject and expiry. See Verifier for
// the other algorithms and checks.
func Verify(secret []byte, token string) (string, time.Time, error) {
	if len(secret) == 0 {
		return "", time.Time{}, fmt.Errorf("%w: no secret", ErrInvalidToken)
	}
	v := &Verifier{secret: secret, leeway: DefaultLeeway, stop: func() {}}
	c, err := v.Verify(context.Background(), token)
	return c.Subject, c.ExpiresAt, err
}

// SecretFile is the name of the generated secret inside a data dir.
const SecretFile = "jwt-secret"

// MinSecretBytes is the shortest HS256 secret a gateway accepts: the
// hash's output size (RFC 7518 §3.2). A generated secret has 64.
const MinSecretBytes = 32

// LoadSecret returns the JWT secret: explicit if set, else the
// CHATPIPE_JWT_SECRET environment variable, else the secret file in dataDir,
// generated there once (written to a temp name and renamed into place) when
// create is true.
func LoadSecret(explicit, dataDir string, create bool) ([]byte, error) {
	if explicit != "" {
		return []byte(explicit), nil
	}
	if env := os.Getenv(SecretEnv); env != "" {
		return []byte(env), nil
	}
	if dataDir == "" {
		return nil, errors.New("auth: no JWT secret: set --jwt-secret, CHATPIPE_JWT_SECRET or --data-dir")
	}
	path := filepath.Join(dataDir, SecretFile)
	b, err := os.ReadFile(path)
	if err == nil {
		return []byte(strings.TrimSpace(string(b))), nil
	}
	if !errors.Is(err, os.ErrNotExist) || !create {
		return nil, fmt.Errorf("auth: read secret: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("auth: generate secret: %w", err)
	}
	secret := hex.EncodeToString(raw)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("auth: write secret: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("auth: write secret: %w", err)
	}
	return []byte(secret), nil
}

// SecretEnv is the environment variable that holds the HS256 secret: the
// variable of --jwt-secret.
const SecretEnv = "CHATPIPE_JWT_SECRET"

// SecretSources are where every chatpipe command looks for the HS256
// secret, and FindSecret the one order it looks in.
type SecretSources struct {
	Value   string // --jwt-secret (or its variable, SecretEnv)
	File    string // --jwt-secret-file
	DataDir string // a data dir that may hold SecretFile ("": none)
	Create  bool   // generate SecretFile in DataDir when it is missing (dev)
	// Optional: no source at all gives no secret, not an error (a
	// gateway with --jwks-url has HS256 off then).
	Optional bool
}

// FindSecret returns the HS256 secret: --jwt-secret or --jwt-secret-file
// (not both), else SecretEnv, else DataDir's SecretFile (generated when
// Create). With Optional and none of these it returns nil.
func FindSecret(s SecretSources) ([]byte, error) {
	if s.Value != "" && s.File != "" {
		return nil, errors.New("--jwt-secret and --jwt-secret-file are exclusive (" + SecretEnv + " is --jwt-secret too)")
	}
	if s.File != "" {
		key, err := ReadSecretFile(s.File)
		if err != nil {
			return nil, fmt.Errorf("--jwt-secret-file: %w", err)
		}
		return key, nil
	}
	if s.Optional && s.Value == "" && os.Getenv(SecretEnv) == "" && s.DataDir == "" {
		return nil, nil
	}
	return LoadSecret(s.Value, s.DataDir, s.Create)
}

// ReadSecretFile returns the secret held in the file at path (surrounding
// white space trimmed): a secret named by file does not show in `ps`.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: JWT secret file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil, fmt.Errorf("auth: JWT secret file %s is empty", path)
	}
	return []byte(s), nil
}
