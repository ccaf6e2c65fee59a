package shardcore

import (
	"github.com/bits-and-blooms/bloom/v3"
)

// KeyFilter holds the client_message_ids a conversation has used, as a
// filter: MayHold answers "no" only for a key it was never given, and
// "maybe" for every key it was given and, rarely, for one it was not. A
// conversation loaded with its keys (Conv.Known) then answers a key that
// is neither in its dedupe map nor in the filter from memory: it is new,
// and durable state need not be asked (NeedsDedupeLookup). A "maybe" is
// asked as before.
//
// It grows in layers, as a scalable Bloom filter: a full layer is kept
// and a new one twice its size takes the next keys, each with half the
// false-positive rate of the one before, so the filter as a whole keeps
// under twice the first layer's rate however many keys it takes.
type KeyFilter struct {
	layers []*bloom.BloomFilter
	room   uint // keys the newest layer takes before the next one starts
	size   uint // keys the newest layer was made for
	fp     float64
	keys   int
	bytes  int
}

// keyFilterFP is the false-positive rate of a filter's first layer: the
// share of new keys that are still looked up in durable state.
const keyFilterFP = 0.01

// NewKeyFilter returns a filter holding keys, with room for as many again
// (at least 64) in its first layer.
func NewKeyFilter(keys []string) *KeyFilter {
	f := &KeyFilter{fp: keyFilterFP * 2}
	f.grow(max(uint(len(keys))*2, 64))
	for _, k := range keys {
		f.Add(k)
	}
	return f
}

func (f *KeyFilter) grow(n uint) {
	f.fp /= 2
	b := bloom.NewWithEstimates(n, f.fp)
	f.layers = append(f.layers, b)
	f.room, f.size = n, n
	f.bytes += int(b.Cap()/8) + 64
}

// Add records key k.
func (f *KeyFilter) Add(k string) {
	if f.room == 0 {
		f.grow(f.size * 2)
	}
	f.layers[len(f.layers)-1].AddString(k)
	f.room--
	f.keys++
}

// MayHold reports whether k may have been added: false means it never was.
func (f *KeyFilter) MayHold(k string) bool {
	for _, b := range f.layers {
		if b.TestString(k) {
			return true
		}
	}
	return false
}

// Len is the number of keys added (with repeats).
func (f *KeyFilter) Len() int { return f.keys }

// Bytes is about the memory the filter holds.
func (f *KeyFilter) Bytes() int { return f.bytes }
