package loadgen

import (
	"fmt"
	"math"
	"sort"
)

// PeakRate is the peak profile's message rate: 50 M daily active users × 40
// messages a day ÷ 86,400 s × a peak factor of 10 ≈ 231,480 messages/s.
const PeakRate = 231480.0

// Profile is a named load shape. Rate is the full-scale message rate;
// `--scale` multiplies it and `--rate` replaces it.
type Profile struct {
	Name string
	// Rate is the offered message rate (messages/s) at scale 1.
	Rate float64
	// GroupShare is the share of conversations that are groups (3 to
	// MaxGroup members); the others are 1:1. Messages pick a conversation
	// uniformly, so it is also the share of messages sent to groups.
	GroupShare float64
	MaxGroup   int
	// Devices is the number of websocket connections per user.
	Devices int
	// Conversations, when > 0, fixes the number of conversations (the hot
	// profile uses 1); otherwise it follows the rate.
	Conversations int
	// Users, when > 0, fixes the number of users.
	Users int
}

// Profiles are the built-in load shapes.
var Profiles = map[string]Profile{
	"peak": {Name: "peak", Rate: PeakRate, GroupShare: 0.2, MaxGroup: 100, Devices: 2},
	// hot: one conversation of 20 members, 1 device each; everyone sends.
	// Per-conversation and per-user limits must be off to find its ceiling.
	"hot": {Name: "hot", Rate: 1000, GroupShare: 1, MaxGroup: 20, Devices: 1, Conversations: 1, Users: 20},
}

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	var out []string
	for n := range Profiles {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Default rate limits of the stack (docs/protocol.md): the sizing keeps
// every user and conversation well under them.
const (
	DefaultUserRate = 20.0  // commands/s per user
	DefaultConvRate = 100.0 // messages/s per conversation
)

// Shape is what a run creates: users and conversations.
type Shape struct {
	Users         int
	Conversations int
}

// Size picks the number of users and conversations for rate so that, on
// average, a user sends at most a quarter of the per-user limit and a
// conversation gets at most a tenth of the per-conversation limit — room
// for Poisson bursts, retries and the extra commands of membership churn.
// Fixed counts in p win.
func Size(p Profile, rate float64) (Shape, error) {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return Shape{}, fmt.Errorf("loadgen: rate must be positive, got %v", rate)
	}
	s := Shape{Users: p.Users, Conversations: p.Conversations}
	if s.Users <= 0 {
		s.Users = max(int(math.Ceil(rate/(DefaultUserRate/4))), 20)
	}
	if s.Conversations <= 0 {
		s.Conversations = max(int(math.Ceil(rate/(DefaultConvRate/10))), s.Users)
	}
	if p.MaxGroup > s.Users {
		p.MaxGroup = s.Users
	}
	if p.MaxGroup < 2 {
		return Shape{}, fmt.Errorf("loadgen: a profile needs at least 2 users per conversation")
	}
	return s, nil
}
