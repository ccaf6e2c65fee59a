// Package bench measures the ceilings of chatpipe's bare parts on this
// machine, for BENCHMARKS.md: transactional produce into the broker
// (BenchmarkTxnProduce) and bulk insert into the events schema through
// persist's own write path (BenchmarkPersistWrite). tools/bench/ceiling measures
// the bare pipeline end to end (transactional producers → broker →
// persist's read_committed consumer → Postgres). tools/bench/floor measures the
// floor under every websocket frame: what one small loopback TCP write
// and its read cost on this machine. tools/bench/run.sh runs them
// beside chatpipe end to end in one go — its roles as separate processes,
// CPU per message per process and a CPU profile of every role — against
// the same broker and the same Postgres, and tools/bench/report writes
// BENCHMARKS.md with the goal table (each figure beside its target).
//
// Without BENCH_KAFKA the produce benchmarks start an in-process kfake
// broker; without BENCH_PG the Postgres benchmark is skipped. Nothing here
// runs in `go test` without -bench but two measurements on a running stack
// of processes (internal/stacktest), each skipped unless its switch is set:
// TestBenchTakeover (CHATPIPE_BENCH=1), the takeover time of vshards handed
// off and of a frozen worker's share, and TestHotConversationBench
// (CHATPIPE_E2E_HOT_BENCH=1, run by tools/bench/hot.sh), what isolating a
// hot conversation buys its vshard's other conversations.
//
// tools/bench/soak.sh is the soak: the roles as separate processes under a steady
// load for half an hour, sampling each process's RSS and goroutines;
// tools/bench/soakreport turns the samples into the plateau table and a plot, and
// tools/bench/poison sends hostile frames during it (docs/operations.md, "Soak").
package bench
