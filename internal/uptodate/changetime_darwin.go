package uptodate

import (
	"os"
	"syscall"
)

func changeTime(fi os.FileInfo) (int64, uint64, bool) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ctimespec.Nano(), st.Ino, true
	}
	return 0, 0, false
}
