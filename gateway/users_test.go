package gateway

import (
	"testing"
	"time"
)

// any follows the devices attached over every user: true while one is,
// false once the last is detached, and a second detach of a device
// changes nothing.
func TestUsersAnyCountsAttachedDevices(t *testing.T) {
	u := newUsers(0, 0, 0)
	now := time.Now()
	a, _ := u.connect("a", now)
	b, _ := u.connect("b", now)
	s1, s2, s3 := &session{}, &session{}, &session{}
	if u.any() {
		t.Fatal("any() with no device attached")
	}
	u.attach(a, s1)
	u.attach(a, s2)
	u.attach(b, s3)
	u.attach(b, s3) // (the same device again)
	for i, s := range []struct {
		st *userState
		s  *session
	}{{a, s1}, {b, s3}, {b, s3}, {a, s2}} {
		if !u.any() {
			t.Fatalf("any() false before detach %d, with a device still attached", i)
		}
		u.detach(s.st, s.s)
	}
	if u.any() {
		t.Fatal("any() true after every device was detached")
	}
}
