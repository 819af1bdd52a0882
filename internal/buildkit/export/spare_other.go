//go:build !linux

package export

import "os"

// Spares are kept on Linux only: elsewhere nothing tells kiln that a
// process still runs or reads the file it would write into.

func keepSpares(dest string, replaced []string, files []FileCopy) {}

func takeSpare(dest, rel, path string) *os.File { return nil }
