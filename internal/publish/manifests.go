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

// ReleasedManifest is a YAML file of release.manifests as a release
// asset: Name in the assets folder, from Source in the repository.
type ReleasedManifest struct {
	Name       string `json:"name"`
	Source     string `json:"source"`
	References int    `json:"references"`
	SHA256     string `json:"sha256,omitempty"`
}

type manifestFile struct {
	path, rel string
	data      []byte
}

// readManifests reads release.manifests' files under root, each as its
// asset name.
func readManifests(root string, files []config.ManifestFile) ([]manifestFile, error) {
	var out []manifestFile
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f.Path)))
		if err != nil {
			return nil, fmt.Errorf("release.manifests: %w", err)
		}
		out = append(out, manifestFile{f.Path, f.Name, data})
	}
	return out, nil
}

// checkPinnable pins every file as it will be once pushed, with a digest
// still unknown: a file that cannot be pinned fails before anything is
// built or pushed.
func checkPinnable(repository string, images []string, files []manifestFile, field, from string) error {
	placeholders := map[string]yamlref.Pushed{}
	for _, name := range images {
		path := repository + "/" + name
		placeholders[path] = yamlref.Pushed{Name: path, Tag: "v0", Digest: "sha256:" + strings.Repeat("0", 64)}
	}
	_, _, err := pin(files, placeholders, field, from)
	return err
}

// pushedImages keys the images pushed by their path (REPO/IMAGE), each
// with its first reference's repository and tag.
func pushedImages(repository string, results []PushResult) map[string]yamlref.Pushed {
	images := map[string]yamlref.Pushed{}
	for _, r := range results {
		ref := r.Refs[0]
		i := strings.LastIndex(ref, ":")
		images[repository+"/"+r.Name] = yamlref.Pushed{Name: ref[:i], Tag: ref[i+1:], Digest: r.Digest}
	}
	return images
}

// pin rewrites each file with the images pushed; it refuses a set of
// files in which no reference was pinned, which is a misspelt name more
// often than a wish.
func pin(files []manifestFile, images map[string]yamlref.Pushed, field, from string) ([][]byte, []int, error) {
	if len(images) == 0 {
		return nil, nil, fmt.Errorf("%s: no image is pushed, so no reference can be pinned; add images under %s/", field, config.ImagesDir)
	}
	var out [][]byte
	var counts []int
	total := 0
	for _, in := range files {
		data, n, err := yamlref.Resolve(in.data, images)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", field, in.path, err)
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
