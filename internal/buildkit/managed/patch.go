package managed

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

// binaryKey names the managed buildkitd by what kiln carries to build it:
// the tools module and the patch. Another kiln's binary is another file, so
// a kiln never takes it for its own.
func binaryKey() string {
	h := sha256.New()
	for _, b := range [][]byte{toolsGoMod, toolsGoSum, buildkitdPatch} {
		fmt.Fprintf(h, "%d\n", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// patchedCommand is the tools module's package that copies BuildKit's
// cmd/buildkitd with buildkitdPatch applied; the module cache's own files
// are read-only to go (no -overlay there), so the copy is what builds.
const patchedCommand = "buildkitd"

// writePatchedCommand copies the BuildKit module's cmd/buildkitd, as the
// tools module in dir resolves it, into dir/buildkitd with buildkitdPatch
// applied: its own files (tests left out), less those the patch deletes.
// Nothing in the module cache is written.
func writePatchedCommand(ctx context.Context, dir string, env []string) error {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/moby/buildkit")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	json.Unmarshal(out, &mod) // go writes a failed download's reason here, not to stderr
	if err != nil || mod.Dir == "" {
		return fmt.Errorf("download github.com/moby/buildkit %s: %s %v %s", Version, mod.Error, err, stderrOf(err))
	}
	const upstream = "cmd/buildkitd"
	files := map[string][]byte{}
	entries, err := os.ReadDir(filepath.Join(mod.Dir, upstream))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if name := e.Name(); e.Type().IsRegular() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			if files[name], err = os.ReadFile(filepath.Join(mod.Dir, upstream, name)); err != nil {
				return err
			}
		}
	}
	diffs, _, err := gitdiff.Parse(bytes.NewReader(buildkitdPatch))
	if err != nil {
		return fmt.Errorf("internal/buildkit/managed/tools/buildkitd.patch: %w", err)
	}
	for _, f := range diffs {
		name, ok := strings.CutPrefix(f.OldName, upstream+"/")
		src, found := files[name]
		if !ok || !found || strings.Contains(name, "/") || f.NewName != f.OldName && !f.IsDelete {
			return fmt.Errorf("internal/buildkit/managed/tools/buildkitd.patch changes %s, which is not a file of BuildKit %s's %s", f.OldName, Version, upstream)
		}
		var patched bytes.Buffer
		if err := gitdiff.Apply(&patched, bytes.NewReader(src), f); err != nil {
			return fmt.Errorf("internal/buildkit/managed/tools/buildkitd.patch does not apply to BuildKit %s's %s (%w): it was written for another BuildKit; write it again for %s", Version, f.OldName, err, Version)
		}
		if f.IsDelete {
			delete(files, name)
		} else {
			files[name] = patched.Bytes()
		}
	}
	pkg := filepath.Join(dir, patchedCommand)
	if err := os.Mkdir(pkg, 0o755); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(pkg, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func stderrOf(err error) string {
	if exit, ok := err.(*exec.ExitError); ok {
		return strings.TrimSpace(string(exit.Stderr))
	}
	return ""
}
