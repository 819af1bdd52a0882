// Package version holds the build stamp shared by every kiln-built binary.
// The linker sets the variables below with -X; everything else comes from the
// Go build info embedded in the binary, so it cannot drift from the real build.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
)

// Stamped by the linker. Development builds stamp stable values so that a new
// commit does not relink every binary.
var (
	Version      = "v0.0.0-dev"
	GitCommit    = "unknown"
	GitTreeState = "unknown"
)

// Info describes how a binary was built.
type Info struct {
	Binary       string `json:"binary"`
	Version      string `json:"version"`
	GitCommit    string `json:"gitCommit"`
	GitTreeState string `json:"gitTreeState"`
	GoVersion    string `json:"goVersion"`
	Platform     string `json:"platform"`
	CgoEnabled   bool   `json:"cgoEnabled"`
}

// Get returns the build information of the running binary.
func Get(binary string) Info {
	info := Info{
		Binary:       binary,
		Version:      Version,
		GitCommit:    GitCommit,
		GitTreeState: GitTreeState,
		GoVersion:    runtime.Version(),
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info.GoVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "CGO_ENABLED":
				info.CgoEnabled = s.Value == "1"
			case "GOARM":
				info.Platform += "/v" + s.Value
			}
		}
	}
	return info
}

// String renders the information on one line, as `--version` prints it.
func (i Info) String() string {
	cgo := "off"
	if i.CgoEnabled {
		cgo = "on"
	}
	return fmt.Sprintf("%s version %s (commit %s, tree %s) %s %s cgo=%s",
		i.Binary, i.Version, i.GitCommit, i.GitTreeState, i.GoVersion, i.Platform, cgo)
}

// JSON renders the information as served on /version.
func (i Info) JSON() []byte {
	b, _ := json.Marshal(i) // a struct of strings and a bool always marshals
	return b
}
