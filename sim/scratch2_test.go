package sim

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

func TestScratchSeed(t *testing.T) {
	seed, _ := strconv.Atoi(os.Getenv("SEED"))
	cfg := DefaultConfig()
	w := newWorld(cfg, NewSeededChooser(uint64(seed)))
	w.setup()
	for i := 0; i < cfg.Steps; i++ {
		w.randomStep()
	}
	w.drain()
	w.check()
	from, _ := strconv.Atoi(os.Getenv("FROM"))
	to, _ := strconv.Atoi(os.Getenv("TO"))
	for i, l := range w.trace {
		if i >= from && i <= to {
			fmt.Println(l)
		}
	}
	for _, c := range w.convs {
		for _, r := range w.convLog(c) {
			fmt.Printf("%s off %d seq %d %s %s by %s user %s epoch %d pe %d step %d\n", c, r.Offset, r.Event.Seq, r.Event.Kind, r.Event.ClientMessageID, r.Event.Sender, r.Event.UserID, r.Event.Epoch, r.ProducerEpoch, r.CommittedStep)
		}
	}
	fmt.Println(w.staleExample, w.violations)
}
