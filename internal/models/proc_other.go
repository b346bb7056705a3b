//go:build !linux

package models

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
