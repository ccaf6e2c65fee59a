package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
)

// Conversation is one conversation a run creates.
type Conversation struct {
	ID      string   `json:"id"`
	Owner   string   `json:"owner"`
	Members []string `json:"members"` // the owner first
}

// Plan is what a run creates: users with their devices, conversations.
type Plan struct {
	Users         []string       `json:"users"`
	Devices       int            `json:"devices"` // per user
	Conversations []Conversation `json:"conversations"`
}

// DeviceName names device i of user.
func DeviceName(user string, i int) string { return fmt.Sprintf("%s/%d", user, i) }

var runNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,48}$`)

// ValidRunName reports whether name can prefix the run's ids (user and
// conversation ids are "<run>.u<i>", "<run>.c<i>").
func ValidRunName(name string) bool { return runNameRe.MatchString(name) }

// NewPlan makes the users and conversations of a run, deterministically
// from seed. Conversation k is a group with probability groupShare (3 to
// maxGroup members, most of them small: the size follows u⁵ for a uniform
// u, so the median group has about 6 members and a few have close to
// maxGroup), else a 1:1. Members are distinct users; the owner is the
// first.
func NewPlan(run string, s Shape, p Profile, seed uint64) Plan {
	return newPlan(run, s, p, seed, 1)
}

// Shard is one of N parts of a plan (K in 1…N); N ≤ 1 is the whole plan.
type Shard struct{ K, N int }

// Whole reports whether s is the whole plan.
func (s Shard) Whole() bool { return s.N <= 1 }

func (s Shard) String() string {
	if s.Whole() {
		return ""
	}
	return fmt.Sprintf("%d/%d", s.K, s.N)
}

// ParseShard parses "K/N" (1 ≤ K ≤ N); "" is the whole plan.
func ParseShard(v string) (Shard, error) {
	if v == "" {
		return Shard{}, nil
	}
	var s Shard
	if _, err := fmt.Sscanf(v, "%d/%d", &s.K, &s.N); err != nil || s.N < 1 || s.K < 1 || s.K > s.N || fmt.Sprintf("%d/%d", s.K, s.N) != v {
		return Shard{}, fmt.Errorf("loadgen: shard %q: want K/N with 1 ≤ K ≤ N", v)
	}
	return s, nil
}

// ShardPlan makes part sh of the plan that NewPlan would make split into
// sh.N parts: users and conversations are partitioned by index (user i
// and conversation j belong to part i mod N + 1, j mod N + 1) and a
// conversation's members are drawn from its own part's users only, so
// parts never share a user or a conversation; the same seed makes the
// same parts. The users are rounded up to a multiple of N. The whole plan
// (N ≤ 1) is NewPlan's.
func ShardPlan(run string, s Shape, p Profile, seed uint64, sh Shard) (Plan, error) {
	if sh.Whole() {
		return NewPlan(run, s, p, seed), nil
	}
	s.Users = (s.Users + sh.N - 1) / sh.N * sh.N
	if s.Conversations < sh.N || s.Users/sh.N < 2 {
		return Plan{}, fmt.Errorf("loadgen: a plan of %d users and %d conversations cannot be split into %d shards", s.Users, s.Conversations, sh.N)
	}
	return newPlan(run, s, p, seed, sh.N).part(sh), nil
}

// part keeps the users and conversations of shard sh.
func (pl Plan) part(sh Shard) Plan {
	out := Plan{Devices: pl.Devices}
	for i, u := range pl.Users {
		if i%sh.N == sh.K-1 {
			out.Users = append(out.Users, u)
		}
	}
	for j, c := range pl.Conversations {
		if j%sh.N == sh.K-1 {
			out.Conversations = append(out.Conversations, c)
		}
	}
	return out
}

// newPlan makes a plan whose conversation j draws its members from the
// users i with i ≡ j (mod n); s.Users is a multiple of n.
func newPlan(run string, s Shape, p Profile, seed uint64, n int) Plan {
	rng := rand.New(rand.NewPCG(seed, 0x636861747069706))
	pl := Plan{Devices: max(p.Devices, 1)}
	for i := 0; i < s.Users; i++ {
		pl.Users = append(pl.Users, fmt.Sprintf("%s.u%d", run, i))
	}
	per := s.Users / n // users of each part
	maxGroup := min(p.MaxGroup, per)
	for k := 0; k < s.Conversations; k++ {
		size := 2
		if maxGroup >= 3 && rng.Float64() < p.GroupShare {
			u := rng.Float64()
			size = 3 + int(math.Floor(float64(maxGroup-2)*math.Pow(u, 5)))
			size = min(size, maxGroup)
		}
		if p.Conversations == 1 {
			size = maxGroup
		}
		// The owner cycles through the users so everyone owns a few (with
		// s.Users a multiple of n, the owner is in the conversation's part).
		owner := k % s.Users
		members := []string{pl.Users[owner]}
		seen := map[int]bool{owner: true}
		for len(members) < size {
			j := k%n + n*rng.IntN(per)
			if !seen[j] {
				seen[j] = true
				members = append(members, pl.Users[j])
			}
		}
		pl.Conversations = append(pl.Conversations, Conversation{ID: fmt.Sprintf("%s.c%d", run, k), Owner: pl.Users[owner], Members: members})
	}
	return pl
}

// Schedule is the open-loop arrival schedule: message k is due at
// Start + k/Rate, whatever happened to earlier messages.
type Schedule struct {
	Rate float64 // messages/s
}

// Due returns the offset from the start at which message k is due.
func (s Schedule) Due(k int64) float64 { return float64(k) / s.Rate }

// DueBy returns how many messages are due by elapsed seconds (messages
// 0 … n-1).
func (s Schedule) DueBy(elapsed float64) int64 {
	if elapsed < 0 {
		return 0
	}
	return int64(math.Floor(elapsed*s.Rate)) + 1
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6c6f616467656e)) }
