// The actions of a Delta table's JSON log files, read in the driver's JVM: only paths, deletion-vector
// flags and row counts cross into Python, never a statistic (a key's prefix) nor another writer's
// predicate. A log holds a few small files between checkpoints, so a Spark job per question (file
// listing, task scheduling, a collect) cost more than the reading. Compiled at run time by
// lake/bridge.py (Janino); see DeltaTable._actions.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

public class DeltaLogText {
    private static final ObjectMapper JSON = new ObjectMapper();
    // Object stores answer each file in tens of milliseconds: a few in flight at once.
    private static final int READERS = 8;

    /**
     * [[file index, kind, path, carries a deletion vector, numRecords or null]] of every action of
     * `kinds` (add, remove, cdc, sidecar) in `files` (JSON commits or JSON checkpoints), as JSON, in
     * file order. The files are read whole, `READERS` at a time; a missing one fails the call.
     */
    public String actions(final List files, final List kinds, final Configuration conf) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(READERS, files.size())));
        try {
            List futures = new ArrayList();
            for (int i = 0; i < files.size(); i++) {
                final int index = i;
                futures.add(pool.submit(new Callable() {
                    public Object call() throws Exception {
                        return read(index, (String) files.get(index), kinds, conf);
                    }
                }));
            }
            List out = new ArrayList();
            for (int i = 0; i < futures.size(); i++) {
                out.addAll((List) ((Future) futures.get(i)).get());
            }
            return JSON.writeValueAsString(out);
        } finally {
            pool.shutdownNow();
        }
    }

    private static List read(int index, String file, List kinds, Configuration conf) throws Exception {
        Path path = new Path(file);
        FileSystem fs = path.getFileSystem(conf);
        List out = new ArrayList();
        BufferedReader lines = new BufferedReader(new InputStreamReader(fs.open(path), StandardCharsets.UTF_8));
        try {
            for (String line = lines.readLine(); line != null; line = lines.readLine()) {
                if (line.trim().isEmpty()) {
                    continue;
                }
                JsonNode action = JSON.readTree(line);
                for (int k = 0; k < kinds.size(); k++) {
                    String kind = (String) kinds.get(k);
                    JsonNode body = action.get(kind);
                    if (body == null || !body.has("path")) {
                        continue;
                    }
                    JsonNode vector = body.get("deletionVector");
                    out.add(new Object[] {Integer.valueOf(index), kind, body.get("path").asText(),
                        Boolean.valueOf(vector != null && !vector.isNull()), records(body)});
                }
            }
        } finally {
            lines.close();
        }
        return out;
    }

    private static Long records(JsonNode body) throws Exception {
        JsonNode raw = body.get("stats");
        if (raw == null || raw.isNull()) {
            return null;
        }
        JsonNode count = JSON.readTree(raw.asText()).get("numRecords");
        return count == null || count.isNull() ? null : Long.valueOf(count.asLong());
    }
}
