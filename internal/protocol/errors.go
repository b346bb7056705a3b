package protocol

import (
	"errors"
	"fmt"
)

// Sentinel errors. A wire error decodes to an *Error whose Unwrap returns
// the sentinel for its code, so callers test with errors.Is on either side.
var (
	ErrBadFrame    = errors.New("malformed frame")
	ErrUnknownType = errors.New("unknown message type")
	ErrVersion     = errors.New("protocol version mismatch")
	ErrNotReady    = errors.New("daemon not ready")
	ErrDraining    = errors.New("daemon is draining")
	ErrPermission  = errors.New("permission denied")
	ErrBadRequest  = errors.New("bad request")
	ErrBusy        = errors.New("busy")
	ErrInternal    = errors.New("daemon internal error")
	// ErrEmpty: a publish-only daemon holds no layout (its writer went
	// away before commit).
	ErrEmpty = errors.New("daemon cache is empty")
)

// Wire error codes, one per sentinel.
const (
	CodeBadFrame    = "bad_frame"
	CodeUnknownType = "unknown_type"
	CodeVersion     = "version"
	CodeNotReady    = "not_ready"
	CodeDraining    = "draining"
	CodePermission  = "permission_denied"
	CodeBadRequest  = "bad_request"
	CodeBusy        = "busy"
	CodeInternal    = "internal"
	CodeEmpty       = "empty"
)

var codes = []struct {
	code string
	err  error
}{
	{CodeBadFrame, ErrBadFrame},
	{CodeUnknownType, ErrUnknownType},
	{CodeVersion, ErrVersion},
	{CodeNotReady, ErrNotReady},
	{CodeDraining, ErrDraining},
	{CodePermission, ErrPermission},
	{CodeBadRequest, ErrBadRequest},
	{CodeBusy, ErrBusy},
	{CodeInternal, ErrInternal},
	{CodeEmpty, ErrEmpty},
}

// Error is the "error" frame: a code and a message that says what failed
// and on what.
type Error struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message + " (" + e.Code + ")" }

// Unwrap maps the code back to its sentinel; an unknown code (a newer
// daemon) unwraps to ErrInternal.
func (e *Error) Unwrap() error {
	for _, c := range codes {
		if c.code == e.Code {
			return c.err
		}
	}
	return ErrInternal
}

// Errorf builds a wire error with the given code.
func Errorf(code, format string, a ...any) *Error {
	return &Error{Type: TypeError, Version: Version, Code: code, Message: fmt.Sprintf(format, a...)}
}

// ToWire turns any error into a wire error, keeping the code of a sentinel
// it wraps.
func ToWire(err error) *Error {
	var we *Error
	if errors.As(err, &we) {
		return we
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return Errorf(c.code, "%s", err.Error())
		}
	}
	return Errorf(CodeInternal, "%s", err.Error())
}
