package logrecord

import (
	"errors"
	"testing"
)

// TestUnmarshalErrors: a newer version is told apart from a record no
// version can read; a newer version is reported as such even when its
// fields no longer fit this version's types.
func TestUnmarshalErrors(t *testing.T) {
	for _, c := range []struct {
		value string
		want  error
	}{
		{`{"v":2,"kind":"message","conversation_id":"c","seq":1}`, ErrUnsupportedVersion},
		{`{"v":3,"kind":"message","seq":"one","members":{"a":1}}`, ErrUnsupportedVersion},
		{`{"v":2,"kind":"reaction"}`, ErrUnsupportedVersion},
		{`not json`, ErrMalformed},
		{"{\"v\":1,\"kind\":\"message\",\"body\":\"a\x00\"", ErrMalformed},
		{`{"kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":0,"kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":"1","kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"reaction","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"message","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"message","conversation_id":"c","seq":"x"}`, ErrMalformed},
	} {
		_, err := Unmarshal([]byte(c.value))
		if !errors.Is(err, c.want) {
			t.Errorf("Unmarshal(%q) = %v, want %v", c.value, err, c.want)
		}
		other := ErrMalformed
		if c.want == ErrMalformed {
			other = ErrUnsupportedVersion
		}
		if errors.Is(err, other) {
			t.Errorf("Unmarshal(%q) = %v, also %v", c.value, err, other)
		}
	}
	if e, err := Unmarshal([]byte(`{"v":1,"kind":"message","conversation_id":"c","seq":1,"body":"a\u0000b"}`)); err != nil || e.Body != "a\x00b" {
		t.Errorf("a valid record with a NUL in its body = %v, %v; it decodes (only Postgres refuses it)", e, err)
	}
}
