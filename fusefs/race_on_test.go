//go:build race

package fusefs

// raceDetector: multi-GiB runs are too slow under -race; .ci/test.sh runs
// them again without it.
const raceDetector = true
