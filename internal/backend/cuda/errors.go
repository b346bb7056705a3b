package cuda

import (
	"errors"
	"fmt"
)

// Sentinels for errors.Is.
var (
	// ErrNoDriver: libcuda could not be loaded, or lacks a symbol we need.
	ErrNoDriver = errors.New("cuda driver unavailable")
	// ErrNoDevice: the named device is not visible to this process.
	ErrNoDevice = errors.New("cuda device not visible")
	// ErrUnsupported: the device lacks a feature weightcache needs.
	ErrUnsupported = errors.New("not supported by the cuda device")
	// ErrOutOfMemory: the device has no room.
	ErrOutOfMemory = errors.New("cuda device out of memory")
)

// Error is a failed driver call: which call, and the CUresult with the name
// cuGetErrorName gives it.
type Error struct {
	Call string
	Code uint32
	Name string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code) }

// Is lets callers test driver errors against the package sentinels.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrOutOfMemory:
		return e.Code == cudaErrorOutOfMemory
	case ErrUnsupported:
		return e.Code == cudaErrorNotSupport
	case ErrNoDevice:
		return e.Code == cudaErrorNoDevice
	}
	return false
}
