package gateway

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// users tracks, per user on this gateway, the open connections and the
// command rate limiter. An entry outlives the user's last connection for a
// while, so reconnecting does not refill the bucket.
type users struct {
	perSec  float64
	burst   int
	maxConn int

	mu       sync.Mutex
	m        map[string]*userState
	attached int // devices attached, over every user
}

type userState struct {
	conns   int
	devices map[*session]struct{} // open sessions, for delivery
	limiter *rate.Limiter         // nil: no limit
	idle    time.Time             // when conns last dropped to zero
}

func newUsers(perSec float64, burst, maxConn int) *users {
	return &users{perSec: perSec, burst: burst, maxConn: maxConn, m: map[string]*userState{}}
}

// connect registers a connection of user; false when the user has
// MaxConnsPerUser open already.
func (u *users) connect(user string, now time.Time) (*userState, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.m) > 10000 {
		u.sweepLocked(now)
	}
	st := u.m[user]
	if st == nil {
		st = &userState{}
		if u.perSec > 0 {
			st.limiter = rate.NewLimiter(rate.Limit(u.perSec), u.burst)
		}
		u.m[user] = st
	}
	if u.maxConn > 0 && st.conns >= u.maxConn {
		return nil, false
	}
	st.conns++
	return st, true
}

func (u *users) disconnect(st *userState, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	st.conns--
	if st.conns == 0 {
		st.idle = now
	}
}

// attach adds a session to its user's devices (before it reads any command:
// delivery to it starts before its first sync can run).
func (u *users) attach(st *userState, s *session) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st.devices == nil {
		st.devices = map[*session]struct{}{}
	}
	if _, ok := st.devices[s]; !ok {
		u.attached++
	}
	st.devices[s] = struct{}{}
}

func (u *users) detach(st *userState, s *session) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := st.devices[s]; ok {
		u.attached--
		delete(st.devices, s)
	}
}

// any reports whether any device is attached.
func (u *users) any() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.attached > 0
}

// local reports whether user has a device connected here.
func (u *users) local(user string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	st := u.m[user]
	return st != nil && len(st.devices) > 0
}

// each calls fn for every device of user (under the lock: fn must not block).
func (u *users) each(user string, fn func(*session)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if st := u.m[user]; st != nil {
		for s := range st.devices {
			fn(s)
		}
	}
}

// sweepLocked forgets users idle for a minute, whose buckets are full again.
func (u *users) sweepLocked(now time.Time) {
	for k, st := range u.m {
		if st.conns == 0 && now.Sub(st.idle) > time.Minute {
			delete(u.m, k)
		}
	}
}

// allow takes one command from the user's bucket; when empty it returns
// how long until a token is there.
func (st *userState) allow(now time.Time) (time.Duration, bool) {
	if st.limiter == nil {
		return 0, true
	}
	r := st.limiter.ReserveN(now, 1)
	if !r.OK() {
		return time.Second, false
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}
