//go:build mage

// Run `go run mage.go -l` for kiln's targets.
package main

import (
	//mage:import
	_ "github.com/kiln-build/kiln/targets"
	//mage:import
	_ "github.com/kiln-build/kiln/targets/namespaces"
)
