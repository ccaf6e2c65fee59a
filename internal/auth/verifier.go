package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"

	"github.com/chatpipe/chatpipe/protocol"
)

// Defaults of Options.
const (
	// DefaultLeeway is the clock skew allowed on exp, nbf and iat.
	DefaultLeeway = 5 * time.Second
	// DefaultJWKSRefresh is how often the JWK Set is fetched again.
	DefaultJWKSRefresh = 5 * time.Minute
	// DefaultJWKSMinRefresh is the least time between two fetches caused by
	// a token whose kid is not in the set.
	DefaultJWKSMinRefresh = 10 * time.Second
	// jwksWaitMax bounds how long one verification waits for a fetch
	// caused by an unknown kid (the rate limiter's wait and the request).
	jwksWaitMax = 5 * time.Second
	// jwksHTTPTimeout bounds one fetch of the JWK Set.
	jwksHTTPTimeout = 10 * time.Second
)

// AsymmetricAlgs are the signing algorithms verified against the JWK Set.
var AsymmetricAlgs = []string{"RS256", "ES256", "EdDSA"}

// Options configure a Verifier. At least one of Secret and JWKSURL is
// required; with both, a token's alg picks the key: HS256 is checked
// against Secret only, the algorithms of AsymmetricAlgs against the JWK Set
// only.
type Options struct {
	// Secret is the shared HS256 secret (nil: HS256 tokens are refused).
	Secret []byte
	// JWKSURL is where the JWK Set of the asymmetric keys is fetched
	// (empty: asymmetric tokens are refused).
	JWKSURL string
	// Issuer and Audience, when set, must match the token's iss and one of
	// its aud values exactly; a token without them is then refused.
	Issuer, Audience string
	// Leeway is the clock skew allowed on exp, nbf and iat (0:
	// DefaultLeeway; negative: none).
	Leeway time.Duration
	// JWKSRefresh is how often the JWK Set is fetched again (default
	// DefaultJWKSRefresh). A key removed from the set is refused from the
	// next fetch on.
	JWKSRefresh time.Duration
	// JWKSMinRefresh is the least time between two fetches caused by a
	// token whose kid the set lacks (default DefaultJWKSMinRefresh): a
	// rotated-in key works at once, and garbage kids cannot hammer the
	// key server.
	JWKSMinRefresh time.Duration
	// HTTPClient fetches the JWK Set (default http.DefaultClient).
	HTTPClient *http.Client
	// Log receives failed JWK Set fetches (default slog.Default()).
	Log *slog.Logger
}

// Claims are what a verified token says.
type Claims struct {
	Subject   string    // the user id
	ExpiresAt time.Time // exp
}

// Verifier checks bearer tokens: HS256 with the shared secret and/or
// RS256, ES256 and EdDSA against a JWK Set fetched from a URL and kept
// fresh in the background until Close.
type Verifier struct {
	secret   []byte
	jwks     keyfunc.Keyfunc // nil without a JWKS URL
	issuer   string
	audience string
	leeway   time.Duration
	stop     context.CancelFunc
}

// NewVerifier returns a Verifier. With a JWKS URL it fetches the set once
// (an error if that fails: a gateway should not start unable to check
// tokens) and keeps refreshing it until Close or until ctx ends.
func NewVerifier(ctx context.Context, o Options) (*Verifier, error) {
	if len(o.Secret) == 0 && o.JWKSURL == "" {
		return nil, errors.New("auth: need a JWT secret or a JWKS URL")
	}
	v := &Verifier{secret: o.Secret, issuer: o.Issuer, audience: o.Audience, leeway: o.Leeway, stop: func() {}}
	switch {
	case v.leeway == 0:
		v.leeway = DefaultLeeway
	case v.leeway < 0:
		v.leeway = 0
	}
	if o.JWKSURL == "" {
		return v, nil
	}
	u, err := url.Parse(o.JWKSURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("auth: JWKS URL %q: want an http(s) URL", o.JWKSURL)
	}
	if o.JWKSRefresh <= 0 {
		o.JWKSRefresh = DefaultJWKSRefresh
	}
	if o.JWKSMinRefresh <= 0 {
		o.JWKSMinRefresh = DefaultJWKSMinRefresh
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	client := o.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	rctx, stop := context.WithCancel(ctx)
	failFirst := false
	kf, err := keyfunc.NewDefaultOverrideCtx(rctx, []string{o.JWKSURL}, keyfunc.Override{
		Client:                    client,
		HTTPTimeout:               jwksHTTPTimeout,
		NoErrorReturnFirstHTTPReq: &failFirst,
		RefreshInterval:           o.JWKSRefresh,
		RefreshUnknownKID:         rate.NewLimiter(rate.Every(o.JWKSMinRefresh), 1),
		RateLimitWaitMax:          jwksWaitMax,
		RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
			return func(_ context.Context, err error) {
				log.Warn("cannot refresh the JWK Set; keeping the keys it had", "url", u, "err", err)
			}
		},
	})
	if err != nil {
		stop()
		return nil, fmt.Errorf("auth: JWKS %s: %w", o.JWKSURL, err)
	}
	v.jwks, v.stop = kf, stop
	return v, nil
}

// Close stops the JWK Set refresher. Safe to call more than once.
func (v *Verifier) Close() { v.stop() }

// Leeway is the clock skew the Verifier allows on exp: a connection's token
// counts as expired only Leeway after its exp.
func (v *Verifier) Leeway() time.Duration { return v.leeway }

// methods are the algorithms a Verifier accepts, given what it has keys for.
func (v *Verifier) methods() []string {
	var m []string
	if len(v.secret) > 0 {
		m = append(m, "HS256")
	}
	if v.jwks != nil {
		m = append(m, AsymmetricAlgs...)
	}
	return m
}

// Verify checks token and returns its claims. Every refusal wraps
// ErrInvalidToken. ctx bounds a JWK Set fetch caused by an unknown kid.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	keys := func(t *jwt.Token) (any, error) {
		// The key is chosen by the algorithm, never by what the token
		// would like: an HS256 token is checked against the shared secret
		// only, so a public key can never serve as an HMAC secret.
		if t.Method.Alg() == "HS256" {
			return v.secret, nil
		}
		return v.jwks.KeyfuncCtx(ctx)(t)
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(v.methods()), jwt.WithExpirationRequired(), jwt.WithIssuedAt(),
		jwt.WithLeeway(v.leeway)}
	if v.issuer != "" {
		opts = append(opts, jwt.WithIssuer(v.issuer))
	}
	if v.audience != "" {
		opts = append(opts, jwt.WithAudience(v.audience))
	}
	var claims jwt.RegisteredClaims
	if _, err := jwt.ParseWithClaims(token, &claims, keys, opts...); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if e := protocol.CheckID("sub", claims.Subject, protocol.DefaultLimits()); e != nil {
		return Claims{}, fmt.Errorf("%w: %s", ErrInvalidToken, e.Message)
	}
	return Claims{Subject: claims.Subject, ExpiresAt: claims.ExpiresAt.Time}, nil
}
