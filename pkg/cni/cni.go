// Package cni is the code of the antrea-cni binary: a CNI plugin that speaks
// the protocol's VERSION command and refuses the others with a CNI error.
package cni

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/kiln-build/kiln/pkg/version"
)

// Name is the binary's name.
const Name = "antrea-cni"

// SupportedVersions are the CNI spec versions this plugin answers VERSION with.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// CNI error code 4: invalid environment variables (the CNI spec's table).
const errInvalidEnvironment = 4

type versionResult struct {
	CNIVersion        string   `json:"cniVersion"`
	SupportedVersions []string `json:"supportedVersions"`
}

type cniError struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
}

// Main runs the plugin. getenv reads CNI_COMMAND; args may hold --version.
func Main(args []string, getenv func(string) string, stdout io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Get(Name))
		return 0
	}
	latest := SupportedVersions[len(SupportedVersions)-1]
	enc := json.NewEncoder(stdout)
	switch cmd := getenv("CNI_COMMAND"); cmd {
	case "VERSION":
		enc.Encode(versionResult{CNIVersion: latest, SupportedVersions: SupportedVersions})
		return 0
	case "":
		enc.Encode(cniError{CNIVersion: latest, Code: errInvalidEnvironment, Msg: "CNI_COMMAND is not set"})
		return 1
	default:
		enc.Encode(cniError{CNIVersion: latest, Code: errInvalidEnvironment,
			Msg: fmt.Sprintf("unsupported CNI_COMMAND %q", cmd), Details: "this plugin answers VERSION only"})
		return 1
	}
}
