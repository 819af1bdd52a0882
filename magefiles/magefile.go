//go:build mage

// This repository builds its binaries with kiln: these two imports are all
// an adopting repository writes (with magefiles/go.mod requiring kiln).
// Run `go run mage.go -l` for the targets.
package main

import (
	//mage:import
	_ "github.com/kiln-build/kiln/targets"
	//mage:import
	_ "github.com/kiln-build/kiln/targets/namespaces"
)
