package build_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/build"
	"github.com/kiln-build/kiln/internal/testdaemon"
)

// Release assets are built for darwin and windows too; a module only those
// platforms import (cobra's mousetrap, on windows) must be downloaded.
func TestModulesOfEveryPlatformTheBinariesAreBuiltFor(t *testing.T) {
	has := func(p []string) bool {
		return slices.ContainsFunc(p, func(m string) bool { return strings.HasPrefix(m, "github.com/inconshreveable/mousetrap@") })
	}
	linux, err := build.Plan(build.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64"})
	if err != nil {
		t.Fatal(err)
	}
	withWindows, err := build.Plan(build.Options{Root: testdaemon.RepoRoot(t), Platforms: "linux/amd64", BinaryPlatforms: "windows/amd64,darwin/arm64"})
	if err != nil {
		t.Fatal(err)
	}
	if has(linux.Modules) || !has(withWindows.Modules) {
		t.Errorf("mousetrap in the linux plan: %t, in the plan with windows assets: %t; want false, true", has(linux.Modules), has(withWindows.Modules))
	}
}
