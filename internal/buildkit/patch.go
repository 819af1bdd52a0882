package buildkit

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// buildkitdPatch cuts from BuildKit's cmd/buildkitd what the managed daemon
// never runs (its preamble says what and why).
//
//go:embed tools/buildkitd.patch
var buildkitdPatch []byte

// binaryKey names the managed buildkitd by everything it is built from: the
// tools module and the patch. A binary of another kiln's tools is another
// file, so neither kiln runs the other's.
func binaryKey() string {
	h := sha256.New()
	for _, b := range [][]byte{toolsGoMod, toolsGoSum, buildkitdPatch} {
		fmt.Fprintf(h, "%d\n", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// writeOverlay applies buildkitdPatch to the BuildKit module's files as the
// tools module in dir resolves them, writes the results under dir and
// returns a go build -overlay file that puts them in place of the originals
// (a deleted file is an empty replacement). Nothing in the module cache is
// written.
func writeOverlay(ctx context.Context, dir string, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/moby/buildkit")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("download github.com/moby/buildkit %s: %w\n%s", Version, err, stderrOf(err))
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("download github.com/moby/buildkit %s: %s %v", Version, mod.Error, err)
	}
	files, _, err := gitdiff.Parse(bytes.NewReader(buildkitdPatch))
	if err != nil {
		return "", fmt.Errorf("internal/buildkit/tools/buildkitd.patch: %w", err)
	}
	overlay := map[string]string{}
	for i, f := range files {
		orig := filepath.Join(mod.Dir, filepath.FromSlash(f.OldName))
		src, err := os.ReadFile(orig)
		if err != nil {
			return "", fmt.Errorf("internal/buildkit/tools/buildkitd.patch: %w", err)
		}
		var patched bytes.Buffer
		if err := gitdiff.Apply(&patched, bytes.NewReader(src), f); err != nil {
			return "", fmt.Errorf("internal/buildkit/tools/buildkitd.patch does not apply to BuildKit %s's %s (%w): the patch is for %s only; write it again for this version", Version, f.OldName, err, Version)
		}
		if f.IsDelete {
			overlay[orig] = ""
			continue
		}
		path := filepath.Join(dir, fmt.Sprintf("patched-%d-%s", i, filepath.Base(f.NewName)))
		if err := os.WriteFile(path, patched.Bytes(), 0o644); err != nil {
			return "", err
		}
		overlay[orig] = path
	}
	b, err := json.Marshal(map[string]map[string]string{"Replace": overlay})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "overlay.json")
	return path, os.WriteFile(path, b, 0o644)
}

func stderrOf(err error) string {
	if exit, ok := err.(*exec.ExitError); ok {
		return strings.TrimSpace(string(exit.Stderr))
	}
	return ""
}
