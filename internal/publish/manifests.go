package publish

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/yamlref"
)

// ManifestFile is a YAML file to pin: its path, its name as an output
// (or asset), and its bytes.
type ManifestFile struct {
	Path, Rel string
	Data      []byte
}

// ReadManifests reads release.manifests' files under root, each as its
// asset name.
func ReadManifests(root string, files []config.ManifestFile) ([]ManifestFile, error) {
	var out []ManifestFile
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f.Path)))
		if err != nil {
			return nil, fmt.Errorf("release.manifests: %w", err)
		}
		out = append(out, ManifestFile{f.Path, f.Name, data})
	}
	return out, nil
}

// CheckPinnable pins every file as it will be once pushed, with a digest
// still unknown: a file that cannot be pinned fails before anything is
// built or pushed.
func CheckPinnable(repository string, images []string, files []ManifestFile, field, from string) error {
	placeholders := map[string]yamlref.Pushed{}
	for _, name := range images {
		path := repository + "/" + name
		placeholders[path] = yamlref.Pushed{Name: path, Tag: "v0", Digest: "sha256:" + strings.Repeat("0", 64)}
	}
	_, _, err := Pin(files, placeholders, field, from)
	return err
}

// PushedImages keys the images pushed by their path (REPO/IMAGE), each
// with its first reference's repository and tag.
func PushedImages(repository string, results []PushResult) map[string]yamlref.Pushed {
	images := map[string]yamlref.Pushed{}
	for _, r := range results {
		ref := r.Refs[0]
		i := strings.LastIndex(ref, ":")
		images[repository+"/"+r.Name] = yamlref.Pushed{Name: ref[:i], Tag: ref[i+1:], Digest: r.Digest}
	}
	return images
}

// Pin rewrites each file with the images pushed; it refuses a set of
// files in which no reference was pinned, which is a misspelt name more
// often than a wish.
func Pin(files []ManifestFile, images map[string]yamlref.Pushed, field, from string) ([][]byte, []int, error) {
	if len(images) == 0 {
		return nil, nil, fmt.Errorf("%s: no image is pushed, so no reference can be pinned; add images under %s/", field, config.ImagesDir)
	}
	var out [][]byte
	var counts []int
	total := 0
	for _, in := range files {
		data, n, err := yamlref.Resolve(in.Data, images)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", field, in.Path, err)
		}
		out, counts = append(out, data), append(counts, n)
		total += n
	}
	if total == 0 {
		names := slices.Sorted(maps.Keys(images))
		if from != "" {
			field += " " + from
		}
		return nil, nil, fmt.Errorf("%s: no reference to %s in %d file(s); write the image as REPO/IMAGE[:TAG] (e.g. image: %s) where it should be pinned",
			field, strings.Join(names, ", "), len(files), names[0])
	}
	return out, counts, nil
}
