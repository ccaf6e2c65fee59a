// Package jsonenc appends JSON values exactly as encoding/json writes them,
// without reflection: the encoders of the hot frames and records
// (protocol.AppendRequest, logrecord's record values) are built on it. It
// is pure: no I/O.
package jsonenc

import (
	"encoding/json"
	"strconv"
)

// String appends s as a JSON string exactly as encoding/json writes it:
// printable ASCII other than `"`, `\`, `<`, `>` and `&` as is; anything
// else through encoding/json itself (its escapes, HTML-safe, and invalid
// UTF-8 replaced by U+FFFD).
func String(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// StringField appends key and s unless s is empty (omitempty).
func StringField(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return String(append(b, key...), s)
}

// IntField appends key and v unless v is 0 (omitempty).
func IntField(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

// Strings appends ss as a JSON array of strings.
func Strings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = String(b, s)
	}
	return append(b, ']')
}
