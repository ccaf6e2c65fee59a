package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/chatpipe/chatpipe/internal/jitter"
	"github.com/chatpipe/chatpipe/protocol"
)

// tokenExpiry reads a JWT's exp without verifying the token; ok is false
// when it cannot (not a JWT, or no exp).
func tokenExpiry(tok string) (exp time.Time, ok bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == nil || *claims.Exp <= 0 {
		return time.Time{}, false
	}
	sec := int64(*claims.Exp)
	return time.Unix(sec, int64((*claims.Exp-float64(sec))*1e9)), true
}

// refreshAt is when to replace a token obtained at got that expires at
// exp: RefreshBefore before exp, or halfway through its life when that is
// later.
func (c *Client) refreshAt(got, exp time.Time) time.Time {
	life := exp.Sub(got)
	return got.Add(max(life-c.opts.RefreshBefore, life/2))
}

// keepToken replaces the connection's token tok with a fresh one from the
// TokenSource before it expires, for as long as ctx (the connection's)
// lasts. It stops when the token's exp cannot be read, when the source
// has nothing that expires later, and when the server refuses a refresh:
// the connection then runs until its token expires, and the commands'
// unauthorized answers make the client dial again.
func (c *Client) keepToken(ctx context.Context, tok string) {
	exp, ok := tokenExpiry(tok)
	if !ok {
		return
	}
	wait := time.Until(c.refreshAt(time.Now(), exp))
	for {
		if !jitter.Sleep(ctx, wait) {
			return
		}
		next, retry, err := c.refreshOnce(ctx, exp)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && retry > 0 && time.Until(exp) > retry:
			c.opts.Logger.Debug("client: token refresh failed; trying again", "err", err, "in", retry)
			wait = retry
			continue
		case err != nil:
			c.opts.Logger.Info("client: token refresh stopped; the connection's token expires at its exp", "err", err, "exp", exp)
			return
		}
		c.opts.Logger.Debug("client: token refreshed", "exp", next)
		exp = next
		wait = time.Until(c.refreshAt(time.Now(), exp))
	}
}

// refreshOnce gets a fresh token and sends it in a refresh; it returns the
// token's exp once the server accepted it. On an error worth trying again
// (the source failed, no answer, rate_limited, unavailable) retry is
// when.
func (c *Client) refreshOnce(ctx context.Context, cur time.Time) (exp time.Time, retry time.Duration, err error) {
	const again = time.Second
	tctx, cancel := context.WithDeadline(ctx, cur)
	defer cancel()
	tok, err := c.ts(tctx)
	if err != nil {
		return time.Time{}, again, fmt.Errorf("client: refresh: token: %w", err)
	}
	exp, ok := tokenExpiry(tok)
	if !ok {
		return time.Time{}, 0, errors.New("client: refresh: the fresh token has no readable exp")
	}
	if !exp.After(cur) {
		return time.Time{}, 0, errors.New("client: refresh: the token source has no token that expires later")
	}
	f, err := c.roundTrip(tctx, protocol.Request{Op: protocol.OpRefresh, Token: tok}, false)
	if err != nil {
		return time.Time{}, again, fmt.Errorf("client: refresh: %w", err)
	}
	switch {
	case f.Op == protocol.OpAccepted:
		return exp, 0, nil
	case f.Code == protocol.CodeRateLimited || f.Code == protocol.CodeUnavailable:
		return time.Time{}, max(time.Duration(f.RetryAfterMS)*time.Millisecond, 100*time.Millisecond),
			fmt.Errorf("client: refresh: %s: %s", f.Code, f.Message)
	}
	return time.Time{}, 0, fmt.Errorf("client: refresh: %s: %s", f.Code, f.Message)
}
