// Command antrea-cni is Antrea's CNI plugin, reduced to what kiln's builds
// exercise.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/kiln-build/kiln/pkg/cni"
)

func main() {
	// --version and a VERSION without config are answered here; every other
	// invocation goes through the CNI library's dispatcher.
	if len(os.Args) > 1 || os.Getenv("CNI_COMMAND") == "" || os.Getenv("CNI_COMMAND") == "VERSION" {
		os.Exit(cni.Main(os.Args[1:], os.Getenv, os.Stdout))
	}
	skel.PluginMainFuncs(cni.Funcs(), cni.PluginInfo, "antrea-cni "+os.Getenv("CNI_COMMAND"))
}
