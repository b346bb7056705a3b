// Command weightcache keeps model weights resident in device memory and hands
// them to inference engines over a Unix socket. The commands live in
// internal/commands; this file only hands over to them.
package main

import (
	"os"

	"github.com/weightcache/weightcache/internal/commands"
)

func main() {
	os.Exit(commands.Main(os.Args[1:]))
}
