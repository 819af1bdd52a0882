package image

import (
	"strings"

	"github.com/package-url/packageurl-go"
)

// GoPURL is the package URL of a Go module version, written by the
// package-url library as other SBOM tools write it: the path's last element
// is the name, the rest the namespace, and a "+incompatible" version is
// percent-encoded.
func GoPURL(path, version string) string {
	namespace, name := "", path
	if i := strings.LastIndex(path, "/"); i >= 0 {
		namespace, name = path[:i], path[i+1:]
	}
	return packageurl.NewPackageURL(packageurl.TypeGolang, namespace, name, version, nil, "").ToString()
}
