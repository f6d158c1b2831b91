package fusefs

import (
	"strconv"
	"strings"
)

// UnescapeMountInfo undoes the kernel's octal escapes in a field of
// /proc/PID/mountinfo (a space is \040, a tab \011, a newline \012, a
// backslash \134), which k8s.io/mount-utils leaves in. The one decoder of
// mount table fields for blobfs mount, the CSI driver and the benchmarks.
func UnescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
