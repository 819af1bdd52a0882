// Package cni is the code of the antrea-cni binary: a CNI plugin built on
// containernetworking/cni (skel, version, types) as Antrea's is. It answers
// VERSION and refuses the others with a CNI error.
package cni

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"

	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antrea-cni"

// SupportedVersions are the CNI spec versions this plugin answers VERSION with.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// PluginInfo is what VERSION reports, in the library's own form.
var PluginInfo = cniversion.PluginSupports(SupportedVersions...)

// Funcs are the plugin's commands for skel.PluginMainFuncs. Antrea's do
// the networking; the stand-in refuses them with the spec's error 4.
func Funcs() skel.CNIFuncs {
	refuse := func(args *skel.CmdArgs) error {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "unsupported CNI_COMMAND", "this plugin answers VERSION only")
	}
	return skel.CNIFuncs{Add: refuse, Del: refuse, Check: refuse}
}

// Main answers --version and the CNI commands. getenv reads CNI_COMMAND.
func Main(args []string, getenv func(string) string, stdout io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Get(Name))
		return 0
	}
	enc := json.NewEncoder(stdout)
	switch cmd := getenv("CNI_COMMAND"); cmd {
	case "VERSION":
		if err := PluginInfo.Encode(stdout); err != nil {
			return 1
		}
		return 0
	case "":
		e := types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_COMMAND is not set", "")
		enc.Encode(e)
		return 1
	default:
		e := types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unsupported CNI_COMMAND %q", cmd), "this plugin answers VERSION only")
		enc.Encode(e)
		return 1
	}
}
