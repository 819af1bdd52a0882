package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoad feeds arbitrary kiln.yaml and image.yaml contents to the loader:
// every input must give a configuration or an error naming a file, never a
// panic. The seed corpus is in testdata/fuzz/FuzzLoad.
func FuzzLoad(f *testing.F) {
	f.Add(goodKiln, goodImage)
	f.Add(strings.Replace(goodKiln, "linux/arm64", "linux/arm/v7", 1), "binaries: [antctl]\nentrypoint: [/x]\nfiles:\n  - src: a\n    dest: /a\n")
	f.Add("toolchain: [", "binaries: {")
	f.Add("budgets:\n  antctl: 1e999MiB\n"+goodKiln, goodImage)
	root := f.TempDir() // one tree per worker, rewritten for every input
	f.Fuzz(func(t *testing.T, kiln, image string) {
		for rel, content := range map[string]string{File: kiln, "images/antrea-agent/image.yaml": image} {
			path := filepath.Join(root, rel)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		c, err := Load(root)
		if err != nil {
			if !strings.Contains(err.Error(), File) && !strings.Contains(err.Error(), "images/") {
				t.Fatalf("error names no file: %v", err)
			}
			return
		}
		c.Drift() // must not panic either
		for _, b := range c.Binaries {
			c.Effective(b)
		}
	})
}
