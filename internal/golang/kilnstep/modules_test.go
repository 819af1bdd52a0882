package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-build/kiln/internal/modfixture"
)

// TestModuleLayerCopiesOnlyWhatGoSumVouchesFor fills a module cache as the
// download step does, plants a change in one module and leaves another
// out, then builds the module layer from it. The intact module is copied
// without its zip (its path has an upper-case letter, which the cache
// escapes); the planted one and the absent one are downloaded again from
// the proxy, go checking their zips; and a compile offline finds every
// module in the layer.
func TestModuleLayerCopiesOnlyWhatGoSumVouchesFor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	proxy, main, src, dest := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	pkg := func(name string) map[string]string {
		return map[string]string{
			"go.mod":            "module example.com/" + name + "\n\ngo 1.26\n",
			"lib.go":            "package " + strings.ToLower(name) + "\n\nconst Name = \"" + name + "\"\n",
			"sub/deeper/doc.go": "package deeper\n",
		}
	}
	sums := modfixture.Proxy(t, proxy,
		modfixture.Module{Path: "example.com/Intact", Version: "v1.0.0", Files: pkg("Intact")},
		modfixture.Module{Path: "example.com/planted", Version: "v1.0.0", Files: pkg("planted")},
		modfixture.Module{Path: "example.com/absent", Version: "v1.2.0", Files: pkg("absent")})
	modfixture.Write(t, main, map[string]string{
		"go.mod": "module example.com/main\n\ngo 1.26\n\nrequire (\n\texample.com/Intact v1.0.0\n\texample.com/planted v1.0.0\n\texample.com/absent v1.2.0\n)\n",
		"go.sum": sums,
		"main.go": "package main\n\nimport (\n\tintact \"example.com/Intact\"\n\t\"example.com/absent\"\n\t\"example.com/planted\"\n)\n\n" +
			"func main() { println(intact.Name + planted.Name + absent.Name) }\n",
	})
	t.Setenv("GOPROXY", "file://"+filepath.ToSlash(proxy))
	t.Setenv("GOSUMDB", "off")
	t.Setenv("GOFLAGS", "-modcacherw")
	t.Setenv("GOWORK", "off")
	goCmd := func(modcache string, args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = main
		cmd.Env = append(os.Environ(), "GOMODCACHE="+modcache)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	goCmd(src, "mod", "download", "example.com/Intact@v1.0.0", "example.com/planted@v1.0.0")
	planted, err := os.OpenFile(filepath.Join(src, "example.com", "planted@v1.0.0", "lib.go"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	planted.WriteString("\nconst Planted = true\n")
	planted.Close()

	t.Chdir(main)
	mods := []string{"example.com/Intact@v1.0.0", "example.com/planted@v1.0.0", "example.com/absent@v1.2.0"}
	if err := copyModules(src, dest, mods, []string{"go", "mod", "download"}); err != nil {
		t.Fatal(err)
	}
	zipped := func(escaped, version string) bool {
		_, err := os.Stat(filepath.Join(dest, "cache", "download", "example.com", escaped, "@v", version+".zip"))
		return err == nil
	}
	if zipped("!intact", "v1.0.0") {
		t.Error("the intact module was downloaded again, not copied")
	}
	if _, err := os.Stat(filepath.Join(dest, "example.com", "!intact@v1.0.0", "sub", "deeper", "doc.go")); err != nil {
		t.Errorf("the intact module's nested file was not copied: %v", err)
	}
	if !zipped("planted", "v1.0.0") || !zipped("absent", "v1.2.0") {
		t.Error("the planted and the absent module were not downloaded from the proxy")
	}
	if data, err := os.ReadFile(filepath.Join(dest, "example.com", "planted@v1.0.0", "lib.go")); err != nil || strings.Contains(string(data), "Planted") {
		t.Errorf("the layer's planted module: %q, %v; want the proxy's file", data, err)
	}
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=readonly")
	goCmd(dest, "build", "-o", filepath.Join(t.TempDir(), "main"), ".")
}
