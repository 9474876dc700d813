// Tells a driver thread that the stage whose tasks added to some named accumulators has completed
// (lakehouse-dsr's hashsum.py), while another thread's action goes on with its later stages. Spark
// merges a task's accumulator updates before it posts the stage's completion to the listener bus, so
// a thread that has seen the latch open reads the accumulators' final values. Compiled by Janino
// (bridge.py): raw types throughout.
package lakehouse_dsr;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageCompleted;

public class StageDone extends SparkListener {
  private final List ids;
  private final CountDownLatch completed = new CountDownLatch(1);

  public StageDone() { this.ids = new ArrayList(); }

  private StageDone(List ids) { this.ids = ids; }

  /** A new watch, listening on `sc`'s bus, for a stage that added to any accumulator of `ids`. */
  public StageDone watch(SparkContext sc, List ids) {
    List longs = new ArrayList();
    for (Iterator i = ids.iterator(); i.hasNext();) {
      longs.add(Long.valueOf(((Number) i.next()).longValue()));
    }
    StageDone watch = new StageDone(longs);
    sc.addSparkListener(watch);
    return watch;
  }

  public void onStageCompleted(SparkListenerStageCompleted event) {
    scala.collection.mutable.HashMap updated = event.stageInfo().accumulables();  // named accumulators only
    for (Iterator i = ids.iterator(); i.hasNext();) {
      if (updated.contains(i.next())) {
        completed.countDown();
      }
    }
  }

  /** Whether such a stage has completed, waiting up to `millis` for one. */
  public boolean completed(long millis) throws InterruptedException {
    return completed.await(millis, TimeUnit.MILLISECONDS);
  }

  public void close(SparkContext sc) { sc.removeSparkListener(this); }
}
