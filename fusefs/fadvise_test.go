package fusefs

import (
	"os"

	"golang.org/x/sys/unix"
)

func unix_fadviseDontNeed(f *os.File) {
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
