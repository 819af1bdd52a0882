package gocache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entry writes one action and its output the way go's cache does.
func entry(t *testing.T, dir, action, content string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(content))
	out := hex.EncodeToString(sum[:])
	write := func(name, dt string) {
		path := filepath.Join(dir, name[:2], name)
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(dt), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(out+"-d", content)
	write(action+"-a", fmt.Sprintf("v1 %s %s %20d %20d\n", action, out, len(content), 1795983080935140467))
	return out
}

func TestVerify(t *testing.T) {
	action := strings.Repeat("ab", 32)
	good := func(t *testing.T) (string, string) {
		dir := t.TempDir()
		return dir, entry(t, dir, action, "compiled package")
	}
	t.Run("a well-formed snapshot", func(t *testing.T) {
		dir, _ := good(t)
		n, size, err := Verify(dir)
		if err != nil || n != 1 || size == 0 {
			t.Fatalf("Verify = %d, %d, %v", n, size, err)
		}
	})
	for _, tc := range []struct {
		name    string
		corrupt func(dir, out string)
		want    string
	}{
		{"an output that does not hash to its name", func(dir, out string) {
			os.WriteFile(filepath.Join(dir, out[:2], out+"-d"), []byte("tampered package"), 0o644)
		}, "does not hash to its name"},
		{"an action without its output", func(dir, out string) {
			os.Remove(filepath.Join(dir, out[:2], out+"-d"))
		}, "which the snapshot does not hold"},
		{"an action naming another id", func(dir, out string) {
			os.WriteFile(filepath.Join(dir, action[:2], action+"-a"), []byte("v1 "+strings.Repeat("cd", 32)+" "+out+" 16 0\n"), 0o644)
		}, "malformed"},
		{"a stray file", func(dir, out string) {
			os.WriteFile(filepath.Join(dir, "ab", "README"), []byte("hi"), 0o644)
		}, "unexpected file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, out := good(t)
			tc.corrupt(dir, out)
			if _, _, err := Verify(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verify = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
