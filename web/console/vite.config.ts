import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// The build goes where kilnd embeds it; the SDK comes from its sources.
// The SDK imports ws only where a runtime has no WebSocket of its own (Node
// 20), never in a browser: it is left out, so that the build is the same
// whether or not the SDK's own dependencies are installed beside it.
export default defineConfig({
  base: "/",
  resolve: {
    alias: { "@sandkiln/sdk": fileURLToPath(new URL("../../sdk/typescript/src/index.ts", import.meta.url)) },
  },
  build: {
    outDir: fileURLToPath(new URL("../../internal/console/dist", import.meta.url)),
    emptyOutDir: true,
    assetsDir: "assets",
    modulePreload: { polyfill: false },
    reportCompressedSize: true,
    sourcemap: false,
    rollupOptions: { external: ["ws"] },
  },
});
