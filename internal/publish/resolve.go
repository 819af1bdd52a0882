package publish

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/session"
)

// ResolveOptions say which manifests to pin and where they go.
type ResolveOptions struct {
	// From is a YAML file or a folder of them (*.yaml, *.yml, searched
	// through).
	From string
	// Out is the folder the pinned files are written to, in their paths
	// under From; it is replaced as a whole.
	Out string
}

// Resolved is the outcome of images:resolve.
type Resolved struct {
	Images []PushResult `json:"images"`
	// Files are the written files, each with how many references it pins.
	Files []ResolvedFile `json:"files"`
}

// ResolvedFile is one written manifest.
type ResolvedFile struct {
	Path       string `json:"path"`
	References int    `json:"references"`
}

// Resolve pushes every image, as Push does, and writes the manifests under
// ropts.From with every reference to one of them pinned to the digest
// pushed (yamlref.Resolve says which scalars those are). The manifests
// are read and parsed before anything is built, and nothing is written
// unless every file could be pinned.
func Resolve(ctx context.Context, opts session.Options, popts PushOptions, ropts ResolveOptions) (*Resolved, error) {
	inputs, err := manifestFiles(ropts.From)
	if err != nil {
		return nil, err
	}
	cfg, err := opts.Config()
	if err != nil {
		return nil, err
	}
	if ropts.Out == "" {
		root, err := opts.RootDir()
		if err != nil {
			return nil, err
		}
		ropts.Out = filepath.Join(opts.OutDirFor(root), "resolved")
	}
	if err := outsideEachOther(ropts.From, ropts.Out); err != nil {
		return nil, err
	}
	var names []string
	for _, img := range cfg.Images {
		names = append(names, img.Name)
	}
	if err := CheckPinnable(cfg.Repository, names, inputs, "-f", ropts.From); err != nil {
		return nil, err
	}
	results, err := Push(ctx, opts, popts)
	if err != nil {
		return nil, err
	}
	pinned, counts, err := Pin(inputs, PushedImages(cfg.Repository, results), "-f", ropts.From)
	if err != nil {
		return nil, err
	}
	tmp, err := atomicfile.Temp(ropts.Out, true)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := &Resolved{Images: results}
	for i, in := range inputs {
		dest := filepath.Join(tmp, in.Rel)
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(dest, pinned[i], 0o644); err != nil {
			return nil, err
		}
		out.Files = append(out.Files, ResolvedFile{Path: filepath.Join(ropts.Out, in.Rel), References: counts[i]})
	}
	if err := atomicfile.Replace(tmp, ropts.Out); err != nil {
		return nil, err
	}
	return out, nil
}

// outsideEachOther refuses an output folder that holds the manifests or
// lies among them: replacing it would delete them, or the next run would
// read its own output.
func outsideEachOther(from, out string) error {
	f, err := filepath.Abs(from)
	if err != nil {
		return err
	}
	o, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if within(o, f) || within(f, o) {
		return fmt.Errorf("-o %s and -f %s overlap; write the pinned files to a folder of their own (default _output/resolved)", out, from)
	}
	return nil
}

func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// manifestFiles reads the file, or the YAML files under the folder.
func manifestFiles(from string) ([]ManifestFile, error) {
	if from == "" {
		return nil, fmt.Errorf("-f: missing; give a YAML file or a folder of them (Kubernetes manifests, Helm values)")
	}
	fi, err := os.Stat(from)
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	if !fi.IsDir() {
		data, err := os.ReadFile(from)
		if err != nil {
			return nil, fmt.Errorf("-f: %w", err)
		}
		return []ManifestFile{{from, filepath.Base(from), data}}, nil
	}
	var files []ManifestFile
	err = filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || (!strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml")) {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		files = append(files, ManifestFile{p, rel, data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("-f: %s holds no .yaml or .yml file", from)
	}
	return files, nil
}
