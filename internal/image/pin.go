package image

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/distribution/reference"
	"go.yaml.in/yaml/v3"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/yamlref"
)

// Pinned is one base reference images:pin wrote.
type Pinned struct {
	File, Field, From, To string
}

// PinBases resolves every image's base tags (of the repository at root),
// base and each of bases, to the digest the registry serves now and writes
// it into image.yaml, so the build no longer moves with the tag. Bases
// pinned already are left alone, and so is every other byte of the file.
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
		docs, err := yamlref.Documents(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		if len(docs) == 0 || len(docs[0].Content) == 0 {
			continue
		}
		type field struct {
			name string
			node *yaml.Node
		}
		var fields []field
		top := docs[0].Content[0]
		if n := yamlref.Lookup(top, "base"); n != nil {
			fields = append(fields, field{"base", n})
		}
		if bases := yamlref.Lookup(top, "bases"); bases != nil && bases.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(bases.Content); i += 2 {
				fields = append(fields, field{"bases." + bases.Content[i].Value, bases.Content[i+1]})
			}
		}
		var reps []yamlref.Replacement
		for _, f := range fields {
			if f.node.Kind != yaml.ScalarNode || f.node.Value == "" {
				continue
			}
			named, err := reference.ParseNormalizedNamed(f.node.Value)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %q: %w", rel, f.name, f.node.Value, err)
			}
			if _, ok := named.(reference.Digested); ok {
				continue
			}
			named = reference.TagNameOnly(named)
			_, loopback, _ := buildkit.RegistryHost(reference.Domain(named))
			_, desc, err := buildkit.Resolver(loopback, false, buildkit.Credentials()).Resolve(ctx, named.String())
			if err != nil {
				return nil, fmt.Errorf("%s: %s: resolve %s: %w; check the registry %s and your Docker credentials (DOCKER_CONFIG)", rel, f.name, named, err, reference.Domain(named))
			}
			pinned, err := reference.WithDigest(named, desc.Digest)
			if err != nil {
				return nil, err
			}
			reps = append(reps, yamlref.Replacement{Node: f.node, Value: reference.FamiliarString(pinned)})
			out = append(out, Pinned{File: rel, Field: f.name, From: f.node.Value, To: reference.FamiliarString(pinned)})
		}
		if len(reps) == 0 {
			continue
		}
		data, err = yamlref.Apply(data, reps)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		if err := atomicfile.Write(path, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
			return nil, err
		}
	}
	return out, nil
}
