package bench

import (
	"os"
	"testing"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestMain removes the chatpipe binary that the benchmarks which run a
// stack of processes (TestBenchTakeover, TestHotConversationBench) build
// on their first start (stacktest.Build); the others build nothing.
func TestMain(m *testing.M) { os.Exit(stacktest.Run(m)) }
