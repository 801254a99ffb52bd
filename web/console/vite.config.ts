import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

// The build goes where kilnd embeds it; the SDK comes from its sources.
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
  },
});
