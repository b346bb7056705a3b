//go:build linux

package checkpoint

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func statFile(p string) (FileStat, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return FileStat{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return FileStat{Dev: st.Dev, Ino: st.Ino, Size: st.Size,
		MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano()}, nil
}
