//go:build race

package bench

// raceEnabled: the test binary runs under the race detector, so the blobfs
// binary it builds does too, reusing the packages already compiled for it.
const raceEnabled = true
