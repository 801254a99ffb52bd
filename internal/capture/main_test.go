package capture

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		beginAndDie(path)
	}
	goleak.VerifyTestMain(m)
}
