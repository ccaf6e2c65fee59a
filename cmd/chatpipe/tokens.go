package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/chatpipe/chatpipe/internal/auth"
)

// tokenFlags are how a gateway checks bearer tokens: HS256 with the shared
// secret (--jwt-secret, --jwt-secret-file, CHATPIPE_JWT_SECRET or the data
// dir's file) and/or RS256, ES256 and EdDSA against --jwks-url; --jwt-issuer
// and --jwt-audience hold every token to an exact iss and aud.
type tokenFlags struct {
	secret, secretFile, jwksURL, issuer, audience *string
	leeway, jwksRefresh, jwksMinRefresh           *time.Duration
}

// addTokenFlags adds the token flags to fs; secretHelp describes
// --jwt-secret for the command.
func addTokenFlags(fs *flagSet, secretHelp string) tokenFlags {
	f := tokenFlags{
		secret:         fs.String("jwt-secret", "", secretHelp),
		secretFile:     fs.String("jwt-secret-file", "", "file holding the JWT HS256 secret (instead of --jwt-secret, which shows in ps)"),
		jwksURL:        fs.String("jwks-url", "", "URL of a JWK Set: RS256, ES256 and EdDSA tokens are verified against its keys (by kid), fetched again every --jwks-refresh and on an unknown kid"),
		issuer:         fs.String("jwt-issuer", "", "required iss of every token, exact match (empty: not checked)"),
		audience:       fs.String("jwt-audience", "", "required aud of every token, exact match with one of its values (empty: not checked)"),
		leeway:         fs.Duration("jwt-leeway", auth.DefaultLeeway, "clock skew allowed on a token's exp, nbf and iat; an open connection's token expires this long after its exp"),
		jwksRefresh:    fs.Duration("jwks-refresh", auth.DefaultJWKSRefresh, "how often the JWK Set is fetched again (a key removed from it is refused from then on)"),
		jwksMinRefresh: fs.Duration("jwks-min-refresh", auth.DefaultJWKSMinRefresh, "least time between two fetches of the JWK Set caused by a token with an unknown kid"),
	}
	fs.check(notNegative("jwt-leeway"), positive("jwks-refresh"), positive("jwks-min-refresh"))
	return f
}

// loadSecret returns the HS256 secret (auth.FindSecret); with --jwks-url
// and no secret given, nil: HS256 is off.
func (f tokenFlags) loadSecret(dataDir string, create bool) ([]byte, error) {
	return auth.FindSecret(auth.SecretSources{Value: *f.secret, File: *f.secretFile, DataDir: dataDir, Create: create, Optional: *f.jwksURL != ""})
}

// verifier returns the Verifier of these flags with key as the HS256
// secret (nil: HS256 off); with --jwks-url its refresher runs until the
// Verifier is closed or ctx ends.
func (f tokenFlags) verifier(ctx context.Context, key []byte, log *slog.Logger) (*auth.Verifier, error) {
	leeway := *f.leeway
	if leeway == 0 {
		leeway = -1 // none (0 is the Verifier's default)
	}
	v, err := auth.NewVerifier(ctx, auth.Options{Secret: key, JWKSURL: *f.jwksURL, Issuer: *f.issuer, Audience: *f.audience,
		Leeway: leeway, JWKSRefresh: *f.jwksRefresh, JWKSMinRefresh: *f.jwksMinRefresh, Log: log.With("role", "auth")})
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	return v, nil
}
