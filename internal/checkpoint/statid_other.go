//go:build !linux

package checkpoint

import "errors"

func statFile(p string) (FileStat, error) {
	return FileStat{}, errors.New("stat identity of " + p + ": not supported on this platform")
}
