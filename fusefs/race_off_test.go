//go:build !race

package fusefs

const raceDetector = false
