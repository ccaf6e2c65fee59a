// Package web serves the browser pages of the gateway: a small chat client
// over the public websocket protocol at /, and /ops, the pipeline at a glance
// (vshard owners, workers and their leases, rates, fenced writes, takeovers,
// consumer lag) fed by a JSON admin API at /ops/state.
//
// The pages are plain HTML, JavaScript and CSS embedded in the binary; there
// is no build step at serve time. The chat page's protocol code is the
// TypeScript client (clients/typescript) compiled into static/client and
// committed; TestCompiledClientIsCurrent fails when that copy is stale. In
// dev mode (Config.Dev) POST /dev/token mints a client token for any user;
// otherwise that endpoint answers 404.
package web
