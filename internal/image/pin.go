package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/distribution/reference"
	"go.yaml.in/yaml/v3"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
)

// Pinned is one base reference images:pin wrote.
type Pinned struct {
	File, From, To string
}

var baseLine = regexp.MustCompile(`(?m)^base:[ \t]*(\S+)[ \t]*$`)

// PinBases resolves every image's base tag (of the repository at root) to the digest the registry
// serves now and writes it into image.yaml, so the build no longer moves
// with the tag. Bases pinned already are left alone.
func PinBases(ctx context.Context, root string) ([]Pinned, error) {
	files, err := filepath.Glob(filepath.Join(root, config.ImagesDir, "*", config.ImageYAML))
	if err != nil {
		return nil, err
	}
	var out []Pinned
	for _, path := range files {
		rel, _ := filepath.Rel(root, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Base string `yaml:"base"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		if doc.Base == "" {
			continue
		}
		named, err := reference.ParseNormalizedNamed(doc.Base)
		if err != nil {
			return nil, fmt.Errorf("%s: base: %q: %w", rel, doc.Base, err)
		}
		if _, ok := named.(reference.Digested); ok {
			continue
		}
		named = reference.TagNameOnly(named)
		_, loopback, _ := buildkit.RegistryHost(reference.Domain(named))
		_, desc, err := buildkit.Resolver(loopback, false, buildkit.Credentials()).Resolve(ctx, named.String())
		if err != nil {
			return nil, fmt.Errorf("%s: base: resolve %s: %w; check the registry %s and your Docker credentials (DOCKER_CONFIG)", rel, named, err, reference.Domain(named))
		}
		pinned, err := reference.WithDigest(named, desc.Digest)
		if err != nil {
			return nil, err
		}
		m := baseLine.FindSubmatchIndex(data)
		if m == nil {
			return nil, fmt.Errorf("%s: base: not on a line of its own (base: REF); pin it by hand: %s", rel, reference.FamiliarString(pinned))
		}
		data = append(append(bytes.Clone(data[:m[2]]), []byte(reference.FamiliarString(pinned))...), data[m[3]:]...)
		if err := atomicfile.Write(path, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
			return nil, err
		}
		out = append(out, Pinned{File: rel, From: doc.Base, To: reference.FamiliarString(pinned)})
	}
	return out, nil
}
