package main

import (
	"flag"
	"testing"
)

// chatpipe kafka, run with its defaults, creates the topic chatpipe dev
// --kafka needs with its own defaults: the hashed partitions and one per
// dedicated vshard.
func TestKafkaTopicFitsDev(t *testing.T) {
	tree := newCommandTree()
	flagsOf := func(name string) *flag.FlagSet {
		node, _ := tree.find([]string{name})
		return node.FlagSet
	}
	dev := flagsOf("dev")
	intDefault := func(fs *flag.FlagSet, name string) int {
		t.Helper()
		f := fs.Lookup(name)
		if f == nil {
			t.Fatalf("chatpipe %s has no --%s", fs.Name(), name)
		}
		return f.Value.(flag.Getter).Get().(int)
	}
	want := newDevConfig(intDefault(dev, "vshards"), intDefault(dev, "partitions"), intDefault(dev, "dedicated")).Layout().TopicPartitions()
	kafka := flagsOf("kafka")
	if got := intDefault(kafka, "partitions"); got != want {
		t.Errorf("chatpipe kafka creates the topic with %d partitions by default; chatpipe dev needs %d", got, want)
	}
	if got := devTopicPartitions(); got != want {
		t.Errorf("devTopicPartitions() = %d; chatpipe dev's defaults need %d", got, want)
	}
}
