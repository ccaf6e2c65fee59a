//go:build race

package sim

// raceDetector: this test binary was built with -race.
const raceDetector = true
