// Command sbommain is a binary with real module dependencies for the SBOM test.
package main

import (
	"fmt"

	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"golang.org/x/mod/semver"
)

func main() {
	fmt.Println(platforms.DefaultString(), digest.FromString("x"), semver.IsValid("v1.0.0"))
}
